//! Where readings come from: this process's charged memory from /proc, plus a device's.

/// One observation of this process's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryReading {
    /// Host memory the process is charged for (bytes).
    pub host_bytes: u64,
    /// Device memory in use, where a device is watched.
    pub gpu_bytes: Option<u64>,
}

/// Where readings come from: the process itself ([`ProcessMemory`]) or, in tests, anything.
pub trait MemorySampler: Send {
    fn sample(&mut self) -> MemoryReading;
}

impl<F: FnMut() -> MemoryReading + Send> MemorySampler for F {
    fn sample(&mut self) -> MemoryReading {
        self()
    }
}

/// Device memory of an accelerator engine (e.g. a CUDA allocator's reserved bytes). The CPU engine has
/// none; a GPU engine plugs its reading in through [`ProcessMemory::with_device`].
pub trait DeviceMemory: Send {
    /// Bytes in use on the device, `None` when it cannot be read right now.
    fn used_bytes(&mut self) -> Option<u64>;
}

/// This process's GPU memory as NVML reports it, on the GPU where it holds the most (the GPU budget is
/// each GPU's; `None` while it holds none).
pub struct NvmlProcessMemory {
    sampler: memfit_sys::probe::gpu::GpuSampler,
    pid: u32,
}

impl NvmlProcessMemory {
    /// `None` when NVML cannot be loaded (no NVIDIA driver, or a build without memfit-sys's `nvml`).
    pub fn new() -> Option<Self> {
        memfit_sys::probe::gpu::GpuSampler::new().map(|sampler| Self {
            sampler,
            pid: std::process::id(),
        })
    }
}

impl DeviceMemory for NvmlProcessMemory {
    fn used_bytes(&mut self) -> Option<u64> {
        self.sampler.per_pid_largest_gpu().get(&self.pid).copied()
    }
}

/// The memory burn's pools hold on the run's GPUs (reserved from the driver), on the GPU holding
/// the most. What NVML cannot show where it has no per-process figures (in many containers NVML
/// lists no processes); it misses the CUDA context and NVRTC, which NVML counts.
pub struct BurnPoolMemory {
    devices: Vec<burn::prelude::Device>,
}

impl BurnPoolMemory {
    pub fn new(devices: Vec<burn::prelude::Device>) -> Self {
        Self { devices }
    }
}

impl DeviceMemory for BurnPoolMemory {
    fn used_bytes(&mut self) -> Option<u64> {
        (self.devices.iter())
            .filter_map(|d| d.memory_pool_usage().map(|u| u.bytes_reserved))
            .max()
    }
}

/// NVML's per-process figure where it has one, else burn's pools.
pub struct GpuMemory {
    pub nvml: Option<NvmlProcessMemory>,
    pub pools: BurnPoolMemory,
}

impl DeviceMemory for GpuMemory {
    fn used_bytes(&mut self) -> Option<u64> {
        (self.nvml.as_mut().and_then(|n| n.used_bytes())).or_else(|| self.pools.used_bytes())
    }
}

/// This process's memory from /proc/self/status, and a device's if one is attached.
#[derive(Default)]
pub struct ProcessMemory {
    device: Option<Box<dyn DeviceMemory>>,
}

impl ProcessMemory {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_device(device: Box<dyn DeviceMemory>) -> Self {
        Self {
            device: Some(device),
        }
    }
}

/// `RssAnon + RssShmem + VmSwap` of this process; 0 where /proc is unreadable (never fails a run).
pub fn own_charged_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|text| memfit_sys::sample::parse_status(std::process::id() as i32, &text))
        .map_or(0, |m| m.charged())
}

impl MemorySampler for ProcessMemory {
    fn sample(&mut self) -> MemoryReading {
        MemoryReading {
            host_bytes: own_charged_bytes(),
            gpu_bytes: self.device.as_mut().and_then(|d| d.used_bytes()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burn_pools_are_the_fallback_and_a_cpu_device_has_none() {
        // flex keeps no pool: nothing to read, and no NVML here either
        let mut gpu = GpuMemory {
            nvml: None,
            pools: BurnPoolMemory::new(vec![burn::prelude::Device::flex()]),
        };
        assert_eq!(gpu.used_bytes(), None);
    }

    #[test]
    fn own_memory_is_read_from_proc() {
        let mut p = ProcessMemory::new();
        let r = p.sample();
        assert!(r.host_bytes > 0);
        assert_eq!(r.gpu_bytes, None);
    }
}
