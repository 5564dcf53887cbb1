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
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DeviceRequest {
    /// The first CUDA GPU when one can run, else the CPU.
    #[default]
    Auto,
    Cpu,
    /// `cpu:N`: N data-parallel ranks on the CPU (the multi-GPU code path, for checks: no
    /// speed-up, the ranks share the cores).
    CpuRanks(usize),
    /// `cuda` (index 0), `cuda:N`, or `cuda:0,1,2`: one data-parallel rank per GPU.
    Cuda(Vec<usize>),
    /// `cuda:all`: every GPU the driver shows.
    CudaAll,
    /// `wgpu`, in builds with burn's wgpu backend only: the CUDA code path (the device placement,
    /// cubecl's kernels and pool) on whatever adapter wgpu finds — here Mesa's software renderer —
    /// to rehearse `scripts/gpu/accept.sh` without a card. Never chosen by `auto`.
    #[cfg(feature = "wgpu")]
    Wgpu,
}

impl FromStr for DeviceRequest {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "--device {s:?}: expected auto, cpu, cuda, cuda:N, cuda:N,M,… (one rank per GPU), \
                 cuda:all, or cpu:N (N ranks on the CPU, for checks)"
            )
        };
        match s {
            "auto" => return Ok(Self::Auto),
            "cpu" => return Ok(Self::Cpu),
            "cuda" => return Ok(Self::Cuda(vec![0])),
            "cuda:all" => return Ok(Self::CudaAll),
            #[cfg(feature = "wgpu")]
            "wgpu" => return Ok(Self::Wgpu),
            _ => {}
        }
        if let Some(n) = s.strip_prefix("cpu:") {
            return match n.parse() {
                Ok(n) if n >= 1 => Ok(Self::CpuRanks(n)),
                _ => Err(bad()),
            };
        }
        let list = s.strip_prefix("cuda:").ok_or_else(bad)?;
        let indices: Vec<usize> = (list.split(','))
            .map(|i| i.parse().map_err(|_| bad()))
            .collect::<Result<_, _>>()?;
        let mut seen = indices.clone();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() != indices.len() {
            return Err(format!("--device {s:?}: a GPU is named twice"));
        }
        Ok(Self::Cuda(indices))
    }
}

impl fmt::Display for DeviceRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Cpu => f.write_str("cpu"),
            Self::CpuRanks(n) => write!(f, "cpu:{n}"),
            Self::Cuda(list) => write!(f, "cuda:{}", join(list)),
            Self::CudaAll => f.write_str("cuda:all"),
            #[cfg(feature = "wgpu")]
            Self::Wgpu => f.write_str("wgpu"),
        }
    }
}

fn join(indices: &[usize]) -> String {
    indices
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
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
    /// The backend of every data-parallel rank (one: no data parallelism); `backend` is rank 0's.
    pub ranks: Vec<Backend>,
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
            ranks: vec![Backend::Flex],
        }
    }

    /// Data-parallel ranks (1: one device).
    pub fn rank_count(&self) -> usize {
        self.ranks.len()
    }

    pub fn is_gpu(&self) -> bool {
        self.gpu.is_some()
    }

    /// `--budget-gpu`'s default on a GPU: 90% of its free memory (the smallest rank's) (the rest for the CUDA context,
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
pub fn resolve(request: &DeviceRequest) -> Result<ChosenDevice, DeviceError> {
    let fail = |reason: String| DeviceError {
        request: request.clone(),
        reason,
    };
    match request {
        DeviceRequest::Cpu => Ok(ChosenDevice::cpu("asked")),
        DeviceRequest::CpuRanks(n) => Ok(ChosenDevice {
            label: format!("cpu:{n}"),
            ranks: vec![Backend::Flex; *n],
            ..ChosenDevice::cpu("asked: data-parallel ranks on the CPU, for checks")
        }),
        DeviceRequest::Cuda(indices) => cuda_ranks(indices, "asked").map_err(fail),
        DeviceRequest::CudaAll => {
            let count = cuda::driver().map(|d| d.devices.len()).unwrap_or(0);
            cuda_ranks(&(0..count.max(1)).collect::<Vec<_>>(), "asked: every GPU").map_err(fail)
        }
        #[cfg(feature = "wgpu")]
        DeviceRequest::Wgpu => Ok(ChosenDevice {
            backend: Backend::Wgpu,
            placement: Placement::Device,
            label: "wgpu".into(),
            gpu: Some("wgpu's default adapter".into()),
            gpu_free_bytes: None,
            why: "asked: a rehearsal of the GPU code path, not for training".into(),
            ranks: vec![Backend::Wgpu],
        }),
        DeviceRequest::Auto => Ok(match cuda_device(0, "auto: a CUDA GPU is visible") {
            Ok(chosen) => chosen,
            Err(why) => ChosenDevice::cpu(format!("auto: {why}")),
        }),
    }
}

/// One rank per GPU of `indices`: rank 0's device, every rank's backend, the smallest free memory
/// (the start is planned for the smallest GPU). Several need NCCL, checked here.
fn cuda_ranks(indices: &[usize], why: &str) -> Result<ChosenDevice, String> {
    let devices: Vec<ChosenDevice> = (indices.iter())
        .map(|&i| cuda_device(i, why))
        .collect::<Result<_, _>>()?;
    let mut first = devices[0].clone();
    if devices.len() > 1 {
        cuda::find_nccl()?;
        first.label = format!("cuda:{}", join(indices));
        first.ranks = devices.iter().map(|d| d.backend).collect();
        first.gpu_free_bytes = devices.iter().filter_map(|d| d.gpu_free_bytes).min();
    }
    Ok(first)
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
    #[cfg(feature = "cuda")]
    crate::kernel_cache::keep_compiled_kernels();
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
        ranks: vec![cuda_backend(index)],
    })
}

/// Whether `memfit train` can compute on this machine's CUDA GPUs (for `memfit check`).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuTraining {
    /// The GPUs the CUDA driver shows, by index.
    pub devices: Vec<String>,
    /// What it would run with (`CUDA 13.0 driver, NVRTC …`), or why it cannot.
    pub ready: Result<String, String>,
    /// With several GPUs: whether data-parallel training (`--device cuda:all`) finds NCCL (the
    /// name it loads under), or what to do.
    pub nccl: Option<Result<String, String>>,
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
    let nccl = (devices.len() > 1).then(cuda::find_nccl);
    GpuTraining {
        devices,
        ready,
        nccl,
    }
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
        for s in [
            "auto",
            "cpu",
            "cuda:0",
            "cuda:3",
            "cuda:0,1,2",
            "cuda:all",
            "cpu:2",
        ] {
            assert_eq!(s.parse::<DeviceRequest>().unwrap().to_string(), s);
        }
        assert_eq!("cuda".parse(), Ok(DeviceRequest::Cuda(vec![0])));
        assert_eq!("cuda:2,0".parse(), Ok(DeviceRequest::Cuda(vec![2, 0])));
        for bad in [
            "gpu", "cuda:", "cuda:x", "cuda:-1", "CPU", "cuda:0,", "cpu:0", "cpu:x",
        ] {
            let e = bad.parse::<DeviceRequest>().unwrap_err();
            assert!(e.contains(bad) && e.contains("cuda:N"), "{e}");
        }
        let twice = "cuda:1,1".parse::<DeviceRequest>().unwrap_err();
        assert!(twice.contains("named twice"), "{twice}");
        // `wgpu`, the rehearsal of the GPU code path, exists only where burn's wgpu backend is built
        let wgpu = "wgpu".parse::<DeviceRequest>();
        assert_eq!(wgpu.is_ok(), cfg!(feature = "wgpu"), "{wgpu:?}");
    }

    #[cfg(feature = "wgpu")]
    #[test]
    fn wgpu_is_the_device_placement_on_burns_wgpu_backend_and_never_auto() {
        let chosen = resolve(&DeviceRequest::Wgpu).unwrap();
        assert_eq!(
            (chosen.backend, chosen.placement),
            (Backend::Wgpu, Placement::Device)
        );
        assert_eq!(chosen.label, "wgpu");
        assert_ne!(
            resolve(&DeviceRequest::Auto).unwrap().backend,
            Backend::Wgpu
        );
    }

    /// On a machine without a usable GPU (CI's), `auto` is the CPU with the reason and an explicit
    /// `cuda` is an error naming what is missing.
    #[test]
    fn without_a_gpu_auto_is_the_cpu_and_cuda_is_an_error() {
        if cuda::driver().is_ok_and(|d| !d.devices.is_empty()) {
            eprintln!("skipped: this machine has a CUDA GPU");
            return;
        }
        let auto = resolve(&DeviceRequest::Auto).unwrap();
        assert_eq!(auto.backend, Backend::Flex);
        assert_eq!(auto.rank_count(), 1);
        assert!(auto.why.starts_with("auto: "), "{}", auto.why);
        let expected = if HAS_CUDA { "libcuda" } else { "without CUDA" };
        for (request, label) in [
            (DeviceRequest::Cuda(vec![7]), "cuda:7"),
            (DeviceRequest::Cuda(vec![0, 1]), "cuda:0,1"),
            (DeviceRequest::CudaAll, "cuda:all"),
        ] {
            let e = resolve(&request).unwrap_err();
            assert!(e.to_string().contains(expected), "{e}");
            assert!(
                e.to_string().starts_with(&format!("--device {label}: ")),
                "{e}"
            );
        }
        let cpu = resolve(&DeviceRequest::CpuRanks(3)).unwrap();
        assert_eq!((cpu.label.as_str(), cpu.rank_count()), ("cpu:3", 3));
    }
}
