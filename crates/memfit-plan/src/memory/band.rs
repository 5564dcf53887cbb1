//! The uncertainty band of an estimate: how far estimates of the same class of setup were from
//! published measurements in leave-one-source-out validation (`docs/accuracy.md`). An estimate
//! of class `c` carries the p90 |error| of the GPU rows of class `c`; [`high`] is the peak that
//! the measured value stays under in 90% of those rows (predicted / (1 − p90)).
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
    /// 90th percentile of |predicted − measured| / measured over them.
    pub p90_abs_error: f64,
}

impl Band {
    /// The peak the measurement stayed under in 90% of the class's rows: bytes / (1 − p90).
    pub fn high(&self, bytes: u64) -> u64 {
        (bytes as f64 / (1.0 - self.p90_abs_error.min(0.9))).ceil() as u64
    }
}

/// The class of a setup: its method, `+sharded` under ZeRO/FSDP, `+offload` with CPU offload.
pub fn class_of(setup: &Setup) -> String {
    let mut c = setup.method.as_str().to_string();
    if setup.zero.stage() >= 1 {
        c += "+sharded";
    }
    if setup.offload_optimizer || setup.offload_params {
        c += "+offload";
    }
    c
}

/// The band an estimate of `setup` carries: its class's, or [`ANY`]'s when the class has fewer
/// than [`MIN_ROWS`] rows.
pub fn for_setup(setup: &Setup) -> Band {
    let class = class_of(setup);
    let any = BANDS
        .iter()
        .find(|b| b.class == ANY)
        .copied()
        .unwrap_or(Band {
            class: ANY,
            rows: 0,
            p90_abs_error: 0.0,
        });
    BANDS
        .iter()
        .find(|b| b.class == class && b.rows >= MIN_ROWS)
        .copied()
        .unwrap_or(any)
}

/// The peak a setup's estimate is planned against: `bytes` widened by the setup's band.
pub fn high(bytes: u64, setup: &Setup) -> u64 {
    for_setup(setup).high(bytes)
}
