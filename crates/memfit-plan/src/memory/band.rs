//! The uncertainty band of an estimate: how far estimates of the same class of setup were from
//! published measurements in leave-one-source-out validation (`docs/accuracy.md`), counting the
//! spread between sources (stacks) as well as within them. A fresh stack's row is modelled as the
//! bias of one of the validated sources (the median signed error of its rows, sources with at
//! least [`MIN_ROWS`] rows) plus the deviation of one of the class's rows from its own source's
//! median; the band's `width` is the 90th percentile of the shortfall −(bias + deviation) over
//! every such pair, and [`Band::high`] = predicted / (1 − width) is the peak the measurement
//! stays under in 90% of them (`validation::stats::band_width`).
//!
//! The table [`BANDS`] is generated from `validation/` by
//! `cargo run --release -p memfit-plan --example accuracy`; the test
//! `crates/memfit-plan/tests/accuracy.rs` fails when it is stale.

use super::setup::Setup;
use serde::Serialize;

mod table;
pub use table::BANDS;

/// A class needs this many GPU rows to get its own band; else the band over every GPU row
/// ([`ANY`]) applies. Five rows make the p90 the largest error but for none at all.
pub const MIN_ROWS: usize = 5;

/// The class of the band taken over every GPU row.
pub const ANY: &str = "any";

/// The validation band of one class of setups.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Band {
    /// The class the band was measured on (`lora`, `qlora+sharded`, …, or `any`).
    pub class: &'static str,
    /// GPU rows of that class in the validation.
    pub rows: usize,
    /// Validated sources whose bias enters the width.
    pub sources: usize,
    /// 90th percentile of |predicted − measured| / measured over the class's rows, pooled
    /// (informative; the band before the sources' biases counted).
    pub p90_abs_error: f64,
    /// The band: 90th percentile of the shortfall (measured above predicted) of a source's bias
    /// combined with a row's deviation within its source.
    pub width: f64,
}

impl Band {
    /// The peak the measurement stays under in 90% of the combinations: bytes / (1 − width).
    pub fn high(&self, bytes: u64) -> u64 {
        (bytes as f64 / (1.0 - self.width.min(0.9))).ceil() as u64
    }
}

/// The class of a setup: its method, `+sharded` under ZeRO/FSDP across more than one GPU (on one GPU
/// nothing is split, and the sharded rows' errors come from multi-GPU runs), `+offload` with CPU
/// offload.
pub fn class_of(setup: &Setup) -> String {
    let mut c = setup.method.as_str().to_string();
    if setup.zero.stage() >= 1 && setup.gpus * setup.nodes.max(1) > 1 {
        c += "+sharded";
    }
    if setup.offload_optimizer || setup.offload_params {
        c += "+offload";
    }
    c
}

/// The band of memfit's own trainer on a GPU (`memfit_device`): its width is the bound its
/// allocations on memfit's GPU code path are held to on the CPU — every family and the seed's T5
/// SFT at three sizes, with and without checkpointing (crates/memfit-train/tests/device_memory.rs,
/// which checks both figures here).
pub const MEMFIT_DEVICE: Band = Band {
    class: "memfit-device",
    rows: 24,
    sources: 1,
    p90_abs_error: 0.10,
    width: 0.10,
};

/// Where [`MEMFIT_DEVICE`] comes from.
const MEMFIT_DEVICE_BASIS: &str = "memfit's GPU code path run on the CPU (flex with burn's ops and the device \
    ops, which keep what cubecl's kernels keep), its allocations counted: every family at three sizes, with and without checkpointing, within 10%; \
    on an H100 within 10% of cubecl's pool but 6-49% under NVML's peak, not yet counted (docs/gpu.md)";

/// The band an estimate of `setup` carries: its class's, or [`ANY`]'s when the class has fewer
/// than [`MIN_ROWS`] rows; memfit's trainer on a GPU, [`MEMFIT_DEVICE`].
pub fn for_setup(setup: &Setup) -> Band {
    if is_memfit_device(setup) {
        return MEMFIT_DEVICE;
    }
    let class = class_of(setup);
    let any = BANDS
        .iter()
        .find(|b| b.class == ANY)
        .copied()
        .unwrap_or(Band {
            class: ANY,
            rows: 0,
            sources: 0,
            p90_abs_error: 0.0,
            width: 0.0,
        });
    BANDS
        .iter()
        .find(|b| b.class == class && b.rows >= MIN_ROWS)
        .copied()
        .unwrap_or(any)
}

fn is_memfit_device(setup: &Setup) -> bool {
    use super::setup::{Device, Runtime};
    (setup.runtime, setup.device) == (Runtime::Memfit, Device::Cuda)
}

/// The peak a setup's estimate is planned against: `bytes` widened by the setup's band.
pub fn high(bytes: u64, setup: &Setup) -> u64 {
    for_setup(setup).high(bytes)
}

/// The band as `memfit estimate --json` and `memfit plan --json` show it, in the `gpu` object.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BandReport {
    #[serde(flatten)]
    pub band: Band,
    /// The peaks widened by the band: what the measurement stays under in 90% of the class's
    /// combinations of a source's bias and a row's deviation.
    pub peak_allocated_high_bytes: u64,
    pub peak_reserved_high_bytes: u64,
    pub nvml_used_high_bytes: u64,
    /// Where the band comes from.
    pub basis: &'static str,
}

/// The band report of a GPU estimate of `setup`.
pub fn report(setup: &Setup, gpu: &super::GpuEstimate) -> BandReport {
    let band = for_setup(setup);
    BandReport {
        band,
        peak_allocated_high_bytes: band.high(gpu.peak_allocated_bytes),
        peak_reserved_high_bytes: band.high(gpu.peak_reserved_bytes),
        nvml_used_high_bytes: band.high(gpu.nvml_used_bytes),
        basis: if is_memfit_device(setup) {
            MEMFIT_DEVICE_BASIS
        } else {
            "p90 shortfall of a validated source's bias + a class row's deviation within its source, leave-one-source-out (docs/accuracy.md)"
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch;
    use crate::memory::setup::{Method, Zero};

    #[test]
    fn class_names_method_sharding_and_offload() {
        let a = arch::preset("qwen2.5-0.5b").unwrap();
        let mut s = Setup::new(&a);
        s.method = Method::Lora;
        assert_eq!(class_of(&s), "lora");
        s.zero = Zero::parse("3").unwrap();
        s.offload_params = true;
        // one GPU: ZeRO splits nothing
        assert_eq!(class_of(&s), "lora+offload");
        s.gpus = 2;
        assert_eq!(class_of(&s), "lora+sharded+offload");
    }

    #[test]
    fn band_widens_and_falls_back_to_any() {
        let any = BANDS
            .iter()
            .find(|b| b.class == ANY)
            .expect("an `any` band");
        assert!(any.rows >= MIN_ROWS && any.width > 0.0 && any.sources >= 2);
        let a = arch::preset("qwen2.5-0.5b").unwrap();
        let mut s = Setup::new(&a);
        s.method = Method::Freeze; // no validation row is `freeze`
        assert_eq!(for_setup(&s).class, ANY);
        let b = for_setup(&s);
        assert!(b.high(1 << 30) > 1 << 30);
        for b in BANDS {
            assert!((0.0..0.9).contains(&b.width), "{}", b.class);
            assert!((0.0..0.9).contains(&b.p90_abs_error), "{}", b.class);
        }
    }
}
