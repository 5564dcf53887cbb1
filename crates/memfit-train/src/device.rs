//! `--device auto|cpu|cuda|cuda:N`: what a run computes on, settled once before anything is
//! created, with the reason, into the one value every later step reads ([`ChosenDevice`]).
//!
//! A CUDA device is chosen only when this binary was built with CUDA (cargo feature `cuda`), the
//! driver shows the GPU, and NVRTC with the CUDA headers is found (memfit_sys::probe::cuda); an
//! explicit `cuda` that cannot run is an error naming what is missing, never a panic in cudarc and
//! never a silent CPU run. `auto` falls back to the CPU and says why.

use std::fmt;
use std::str::FromStr;

use crate::engine::{Backend, Placement};
use memfit_sys::probe::cuda;

/// `--device` as typed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceRequest {
    /// The first CUDA GPU when one can run, else the CPU.
    #[default]
    Auto,
    Cpu,
    /// `cuda` (index 0) or `cuda:N`.
    Cuda(usize),
}

impl FromStr for DeviceRequest {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad =
            || format!("--device {s:?}: expected auto, cpu, cuda or cuda:N (N a GPU index from 0)");
        match s {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(0)),
            _ => {
                let index = s.strip_prefix("cuda:").ok_or_else(bad)?;
                index.parse().map(Self::Cuda).map_err(|_| bad())
            }
        }
    }
}

impl fmt::Display for DeviceRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// The device a run computes on, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct ChosenDevice {
    pub backend: Backend,
    /// Where the training state lives: the device on a GPU, host RAM on the CPU (where the two
    /// are the same memory and the host placement's fast paths apply).
    pub placement: Placement,
    /// `cpu`, `cuda:0`.
    pub label: String,
    /// The GPU's name, on CUDA.
    pub gpu: Option<String>,
    /// The GPU's free memory when it was chosen (NVML), on CUDA.
    pub gpu_free_bytes: Option<u64>,
    /// Why this device: `asked`, `auto: …`.
    pub why: String,
}

impl ChosenDevice {
    pub fn cpu(why: impl Into<String>) -> Self {
        Self {
            backend: Backend::Flex,
            placement: Placement::Host,
            label: "cpu".into(),
            gpu: None,
            gpu_free_bytes: None,
            why: why.into(),
        }
    }

    pub fn is_gpu(&self) -> bool {
        self.gpu.is_some()
    }

    /// `--budget-gpu`'s default on a GPU: 90% of its free memory (the rest for the CUDA context,
    /// NVRTC and other processes' growth).
    pub fn default_gpu_budget(&self) -> Option<u64> {
        self.gpu_free_bytes.map(|free| free / 10 * 9)
    }

    /// `cuda:0 (NVIDIA H100 80GB HBM3; asked)`, `cpu (auto: no NVIDIA driver …)`.
    pub fn describe(&self) -> String {
        match &self.gpu {
            Some(name) => format!("{} ({name}; {})", self.label, self.why),
            None => format!("{} ({})", self.label, self.why),
        }
    }
}

/// Why a requested device cannot run: exit 2 with this message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("--device {request}: {reason}")]
pub struct DeviceError {
    pub request: DeviceRequest,
    pub reason: String,
}

/// Whether this binary has burn's CUDA backend.
pub const HAS_CUDA: bool = cfg!(feature = "cuda");

/// Settles `request` (see the module doc). May load NVRTC into the process and set `CUDA_PATH`:
/// call it before the run starts its threads.
pub fn resolve(request: DeviceRequest) -> Result<ChosenDevice, DeviceError> {
    let fail = |reason: String| DeviceError { request, reason };
    match request {
        DeviceRequest::Cpu => Ok(ChosenDevice::cpu("asked")),
        DeviceRequest::Cuda(index) => cuda_device(index, "asked").map_err(fail),
        DeviceRequest::Auto => Ok(match cuda_device(0, "auto: a CUDA GPU is visible") {
            Ok(chosen) => chosen,
            Err(why) => ChosenDevice::cpu(format!("auto: {why}")),
        }),
    }
}

/// CUDA device `index`, or the reason it cannot train here.
fn cuda_device(index: usize, why: &str) -> Result<ChosenDevice, String> {
    if !HAS_CUDA {
        return Err(
            "this memfit binary was built without CUDA (build it with `--features cuda`: \
                    scripts/gpu/build.sh)"
                .into(),
        );
    }
    let driver = cuda::driver()?;
    let Some(name) = driver.devices.get(index) else {
        return Err(format!(
            "no CUDA GPU {index}: the driver (CUDA {}) shows {} GPU(s){}",
            driver.version_text(),
            driver.devices.len(),
            if driver.devices.is_empty() {
                String::new()
            } else {
                format!(", cuda:0 to cuda:{}", driver.devices.len() - 1)
            }
        ));
    };
    let nvrtc = cuda::find_nvrtc()?;
    cuda::prepare_nvrtc(&nvrtc)?;
    Ok(ChosenDevice {
        backend: cuda_backend(index),
        placement: Placement::Device,
        label: format!("cuda:{index}"),
        gpu: Some(name.clone()),
        // NVML numbers GPUs by PCI bus, CUDA fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID:
        // the same order on the one-GPU machines this was checked on
        gpu_free_bytes: memfit_sys::probe::gpus()
            .ok()
            .and_then(|g| g.get(index).map(|g| g.free_bytes)),
        why: why.to_string(),
    })
}

/// Whether `memfit train` can compute on this machine's CUDA GPUs (for `memfit check`).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuTraining {
    /// The GPUs the CUDA driver shows, by index.
    pub devices: Vec<String>,
    /// What it would run with (`CUDA 13.0 driver, NVRTC …`), or why it cannot.
    pub ready: Result<String, String>,
}

/// Checks what [`resolve`] checks for `cuda`, without loading anything into the process.
pub fn gpu_training() -> GpuTraining {
    let driver = cuda::driver();
    let devices = driver
        .as_ref()
        .map(|d| d.devices.clone())
        .unwrap_or_default();
    let ready = (|| {
        let driver = driver?;
        if driver.devices.is_empty() {
            return Err("the NVIDIA driver shows no GPU".to_string());
        }
        if !HAS_CUDA {
            return Err("this memfit binary was built without CUDA (scripts/gpu/build.sh)".into());
        }
        let nvrtc = cuda::find_nvrtc()?;
        Ok(format!(
            "CUDA {} driver, NVRTC {}",
            driver.version_text(),
            nvrtc.library.display()
        ))
    })();
    GpuTraining { devices, ready }
}

#[cfg(feature = "cuda")]
fn cuda_backend(index: usize) -> Backend {
    Backend::Cuda(index)
}

#[cfg(not(feature = "cuda"))]
fn cuda_backend(_index: usize) -> Backend {
    unreachable!("checked by HAS_CUDA")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_print_back() {
        for s in ["auto", "cpu", "cuda:0", "cuda:3"] {
            assert_eq!(s.parse::<DeviceRequest>().unwrap().to_string(), s);
        }
        assert_eq!("cuda".parse(), Ok(DeviceRequest::Cuda(0)));
        for bad in ["gpu", "cuda:", "cuda:x", "cuda:-1", "CPU"] {
            let e = bad.parse::<DeviceRequest>().unwrap_err();
            assert!(e.contains(bad) && e.contains("cuda:N"), "{e}");
        }
    }

    /// On a machine without a usable GPU (CI's), `auto` is the CPU with the reason and an explicit
    /// `cuda` is an error naming what is missing.
    #[test]
    fn without_a_gpu_auto_is_the_cpu_and_cuda_is_an_error() {
        if cuda::driver().is_ok_and(|d| !d.devices.is_empty()) {
            eprintln!("skipped: this machine has a CUDA GPU");
            return;
        }
        let auto = resolve(DeviceRequest::Auto).unwrap();
        assert_eq!(auto.backend, Backend::Flex);
        assert!(auto.why.starts_with("auto: "), "{}", auto.why);
        let e = resolve(DeviceRequest::Cuda(7)).unwrap_err();
        let expected = if HAS_CUDA { "libcuda" } else { "without CUDA" };
        assert!(e.to_string().contains(expected), "{e}");
        assert!(e.to_string().starts_with("--device cuda:7: "), "{e}");
    }
}
