//! Dropout masks drawn from a generator the engine owns (not burn's process-wide one), so that each
//! micro-batch's masks depend only on its seed: the same seed gives the same masks whatever else runs
//! in the process, and a resumed run draws what an uninterrupted one drew.

use burn::prelude::*;
use burn::tensor::TensorData;

/// SplitMix64 (Steele, Lea, Flood 2014): a tiny, well-mixed generator; the trainer's one, for
/// dropout masks, initial weights, derived seeds and the demo task.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        // Constants from the SplitMix64 reference implementation.
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0), by rejection so every value is equally likely.
    pub fn below(&mut self, n: u64) -> u64 {
        let zone = u64::MAX - (u64::MAX % n);
        loop {
            let x = self.next_u64();
            if x < zone {
                return x % n;
            }
        }
    }

    /// XORs `x` into the state: the next outputs form a sub-stream keyed by `x` (derived seeds).
    pub fn perturb(&mut self, x: u64) {
        self.0 ^= x;
    }

    /// Uniform in [0, 1) with 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Standard normal (Box–Muller).
    pub fn next_normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // (0, 1]
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// Inverted dropout: keeps each element with probability `1 - p` and scales kept ones by `1/(1-p)`.
/// Cloning it replays the same masks (how a recomputed block draws what its first pass drew).
#[derive(Debug, Clone)]
pub struct Dropout {
    rng: SplitMix64,
    p: f64,
}

impl Dropout {
    /// `p = 0` (or evaluation) makes every call the identity.
    pub fn new(seed: u64, p: f64) -> Self {
        Self {
            rng: SplitMix64::new(seed),
            p,
        }
    }

    pub fn disabled() -> Self {
        Self::new(0, 0.0)
    }

    pub fn apply<const D: usize>(&mut self, x: Tensor<D>) -> Tensor<D> {
        if self.p <= 0.0 {
            return x;
        }
        let shape = x.shape();
        let n = shape.num_elements();
        let keep_scale = 1.0 / (1.0 - self.p);
        // Compare 32-bit halves against the keep threshold: two draws per u64.
        let threshold = ((1.0 - self.p) * 4_294_967_296.0) as u64;
        let mut dropped = vec![false; n];
        for pair in dropped.chunks_mut(2) {
            let r = self.rng.next_u64();
            pair[0] = r & 0xFFFF_FFFF >= threshold;
            if let Some(second) = pair.get_mut(1) {
                *second = r >> 32 >= threshold;
            }
        }
        // A boolean mask: backward keeps 1 byte per element (an f32 mask multiplied in kept 4, and
        // the product kept its other operand too).
        let dropped = Tensor::<D, Bool>::from_data(TensorData::new(dropped, shape), &x.device());
        x.mask_fill(dropped, 0.0) * keep_scale
    }
}
