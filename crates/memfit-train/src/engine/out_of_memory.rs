//! Telling a device out-of-memory failure from any other panic. burn's tensor ops have no error
//! path: cubecl's allocator reports `OutOfMemory` (cubecl-runtime's `IoError` / `LaunchError`)
//! and the op panics with that error's text. The engine catches the panic of a micro-batch and,
//! when its message is this one, hands the loop [`memfit_nn::ModelError::OutOfMemory`].

use burn::prelude::Device;
use memfit_nn::ModelError;
use std::any::Any;

/// Runs `work` on `device`: a device out-of-memory panic becomes [`ModelError::OutOfMemory`], after
/// the pool's cached pages are given back; any other panic goes on up.
pub(super) fn caught<T>(
    device: &Device,
    work: impl FnOnce() -> Result<T, ModelError>,
) -> Result<T, ModelError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or_else(|payload| {
        let text = message(&payload).unwrap_or_else(|| std::panic::resume_unwind(payload));
        device.memory_cleanup();
        Err(ModelError::OutOfMemory(text))
    })
}

/// The texts cubecl 0.11's out-of-memory errors print (`IoError::OutOfMemory`: "out of device
/// memory allocating …"; `LaunchError::OutOfMemory`: "An out-of-memory error happened …";
/// `IoError::BufferTooBig`: "can't allocate buffer of size: …", one tensor larger than the pool's
/// largest page, which a smaller micro-batch makes smaller), and the CUDA driver's
/// `CUDA_ERROR_OUT_OF_MEMORY`. cubecl reports a failed allocation where the tensor is next read,
/// nested in burn's "Error while reading data" text.
const MARKERS: [&str; 4] = [
    "out of device memory",
    "out-of-memory",
    "can't allocate buffer of size",
    "CUDA_ERROR_OUT_OF_MEMORY",
];

/// The text a panic carries (`panic!` with a message: a `String` or a `&str`).
pub(crate) fn panic_text(payload: &Box<dyn Any + Send>) -> Option<&str> {
    (payload.downcast_ref::<String>().map(String::as_str))
        .or_else(|| payload.downcast_ref::<&str>().copied())
}

/// The panic's message when it reports the device out of memory.
fn message(payload: &Box<dyn Any + Send>) -> Option<String> {
    let text = panic_text(payload)?;
    let says = |line: &str| MARKERS.iter().any(|m| line.contains(m));
    // the line that says it (burn nests cubecl's error in a longer text)
    text.lines().find(|l| says(l)).map(|l| l.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_memory_panics_are_told_from_others() {
        let oom: Box<dyn Any + Send> =
            Box::new("out of device memory allocating 1073741824 bytes\nbacktrace".to_string());
        assert_eq!(
            message(&oom).as_deref(),
            Some("out of device memory allocating 1073741824 bytes")
        );
        let launch: Box<dyn Any + Send> = Box::new("An out-of-memory error happened during launch");
        assert!(message(&launch).is_some());
        let other: Box<dyn Any + Send> = Box::new("index out of bounds".to_string());
        assert_eq!(message(&other), None);
        let not_text: Box<dyn Any + Send> = Box::new(42u32);
        assert_eq!(message(&not_text), None);
        // as burn 0.22 panics on the read after cubecl 0.11 refused a tensor (seen on wgpu)
        let nested: Box<dyn Any + Send> = Box::new(
            "Error while reading data: use `try_into_scalar` instead to catch the error at \
             runtime: Execution(An error happened during execution\nCaused by:\n  An IO error \
             happened\nCaused by:\n  can't allocate buffer of size: 1073741824\nNo backtrace"
                .to_string(),
        );
        assert_eq!(
            message(&nested).as_deref(),
            Some("can't allocate buffer of size: 1073741824")
        );
    }

    /// Built with `--features wgpu`: a tensor cubecl cannot allocate (larger than the software
    /// adapter's largest buffer) is caught as out of memory, and the device works on after it.
    #[cfg(feature = "wgpu")]
    #[test]
    fn a_real_cubecl_allocation_failure_is_caught() {
        use burn::prelude::Tensor;
        let device = Device::wgpu(burn::tensor::DeviceKind::default());
        let sum_of_ones = |n: usize| {
            caught(&device, || {
                let t = Tensor::<1>::ones([n], &device);
                Ok(t.sum().into_scalar::<f32>())
            })
        };
        let too_big = sum_of_ones(1 << 28);
        assert!(
            matches!(&too_big, Err(ModelError::OutOfMemory(m)) if m.contains("allocate")),
            "{too_big:?}"
        );
        assert_eq!(sum_of_ones(1 << 10).unwrap(), 1024.0);
    }

    /// Evaluation and training share the catch: an out-of-memory panic comes back as the error the
    /// loop acts on, any other panic goes on up, and a result passes through.
    #[test]
    fn the_catch_turns_only_out_of_memory_panics_into_errors() {
        let device = Device::flex();
        let oom = caught(&device, || -> Result<(), ModelError> {
            panic!("out of device memory allocating 4096 bytes")
        });
        assert!(
            matches!(&oom, Err(ModelError::OutOfMemory(m)) if m.contains("4096")),
            "{oom:?}"
        );
        assert_eq!(caught(&device, || Ok(7)).unwrap(), 7);
        let other = std::panic::catch_unwind(|| {
            caught(&device, || -> Result<(), ModelError> {
                panic!("index out of bounds")
            })
        });
        assert!(other.is_err(), "another panic is not swallowed");
    }
}
