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
/// memory allocating …"; `LaunchError::OutOfMemory`: "An out-of-memory error happened …"), and the
/// CUDA driver's `CUDA_ERROR_OUT_OF_MEMORY`.
const MARKERS: [&str; 3] = [
    "out of device memory",
    "out-of-memory",
    "CUDA_ERROR_OUT_OF_MEMORY",
];

/// The panic's message when it reports the device out of memory.
fn message(payload: &Box<dyn Any + Send>) -> Option<String> {
    let text = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())?;
    MARKERS
        .iter()
        .any(|m| text.contains(m))
        .then(|| text.lines().next().unwrap_or(text).to_string())
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
