//! GPUs through NVML, loaded at run time: without an NVIDIA driver every call says why, nothing fails.

use std::collections::HashMap;

/// One GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Gpu {
    pub name: String,
    pub total_bytes: u64,
    pub free_bytes: u64,
}

/// The GPUs and the driver version, or why they cannot be listed.
#[cfg(feature = "nvml")]
pub fn gpus_with_driver() -> Result<(Vec<Gpu>, String), String> {
    let nvml = nvml_wrapper::Nvml::init().map_err(|e| format!("NVML not available: {e}"))?;
    let driver = nvml
        .sys_driver_version()
        .unwrap_or_else(|_| "unknown".into());
    let count = nvml.device_count().map_err(|e| format!("NVML: {e}"))?;
    let mut out = Vec::new();
    for index in 0..count {
        let device = nvml
            .device_by_index(index)
            .map_err(|e| format!("NVML device {index}: {e}"))?;
        let memory = device
            .memory_info()
            .map_err(|e| format!("NVML device {index}: {e}"))?;
        out.push(Gpu {
            name: device.name().unwrap_or_else(|_| format!("GPU {index}")),
            total_bytes: memory.total,
            free_bytes: memory.free,
        });
    }
    Ok((out, driver))
}

#[cfg(not(feature = "nvml"))]
pub fn gpus_with_driver() -> Result<(Vec<Gpu>, String), String> {
    Err("NVML support is not built into this binary (memfit-sys feature `nvml`)".into())
}

/// GPU memory used by processes, summed per PID over all devices, for the guard's samples.
pub struct GpuSampler {
    #[cfg(feature = "nvml")]
    nvml: nvml_wrapper::Nvml,
}

impl GpuSampler {
    /// `None` when NVML cannot be loaded (no driver): the guard then samples host memory only.
    pub fn new() -> Option<Self> {
        #[cfg(feature = "nvml")]
        {
            nvml_wrapper::Nvml::init().ok().map(|nvml| Self { nvml })
        }
        #[cfg(not(feature = "nvml"))]
        {
            None
        }
    }

    /// Bytes of GPU memory per PID (compute and graphics contexts), summed over the GPUs.
    pub fn per_pid(&self) -> HashMap<u32, u64> {
        self.per_pid_combined(|a, b| a + b)
    }

    /// Bytes of GPU memory per PID on the GPU where it holds the most: what a per-GPU budget is
    /// held to (a data-parallel trainer holds about the same on each of its GPUs).
    pub fn per_pid_largest_gpu(&self) -> HashMap<u32, u64> {
        self.per_pid_combined(u64::max)
    }

    /// Each PID's bytes on every GPU, combined over the GPUs by `combine`.
    #[cfg(feature = "nvml")]
    fn per_pid_combined(&self, combine: fn(u64, u64) -> u64) -> HashMap<u32, u64> {
        use nvml_wrapper::enums::device::UsedGpuMemory;
        let mut used = HashMap::new();
        let count = self.nvml.device_count().unwrap_or(0);
        for index in 0..count {
            let Ok(device) = self.nvml.device_by_index(index) else {
                continue;
            };
            let compute = device.running_compute_processes().unwrap_or_default();
            let graphics = device.running_graphics_processes().unwrap_or_default();
            let mut on_this_gpu: HashMap<u32, u64> = HashMap::new();
            for p in compute.into_iter().chain(graphics) {
                if let UsedGpuMemory::Used(bytes) = p.used_gpu_memory {
                    *on_this_gpu.entry(p.pid).or_insert(0) += bytes;
                }
            }
            for (pid, bytes) in on_this_gpu {
                let slot = used.entry(pid).or_insert(0);
                *slot = combine(*slot, bytes);
            }
        }
        used
    }

    #[cfg(not(feature = "nvml"))]
    fn per_pid_combined(&self, _combine: fn(u64, u64) -> u64) -> HashMap<u32, u64> {
        HashMap::new()
    }
}
