//! Dropout masks drawn from a generator the engine owns (not burn's process-wide one), so that each
//! micro-batch's masks depend only on its seed: the same seed gives the same masks whatever else runs
//! in the process, and a resumed run draws what an uninterrupted one drew.

use std::sync::{Mutex, PoisonError};

use burn::prelude::*;
use burn::tensor::Distribution;

use crate::kernels::dropout_op;

/// SplitMix64 (Steele, Lea, Flood 2014): a tiny, well-mixed generator; the trainer's one, for
/// dropout masks, initial weights, derived seeds and the demo task.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(SPLITMIX_GAMMA);
        mix(self.0)
    }

    /// The `i`-th output of `SplitMix64::new(seed)` (from 0), without the ones before: each output
    /// depends only on its position, so loops over them vectorise.
    #[inline(always)]
    pub fn output(seed: u64, i: u64) -> u64 {
        mix(seed.wrapping_add(i.wrapping_add(1).wrapping_mul(SPLITMIX_GAMMA)))
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

    /// Skips `n` outputs: the state advances by a constant per output.
    pub fn skip(&mut self, n: u64) {
        self.0 = self.0.wrapping_add(n.wrapping_mul(SPLITMIX_GAMMA));
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

/// SplitMix64's increment (the golden ratio's fraction of 2^64), from its reference implementation
/// as `mix`'s constants are.
pub(crate) const SPLITMIX_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

#[inline(always)]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
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
        if dropout_op::supported(&x) {
            let seed = self.mask_seed(x.shape().num_elements());
            return dropout_op::dropout(x, seed, self.p);
        }
        // Other dtypes and backends: a boolean mask, of which backward keeps 1 byte per element
        // (an f32 mask multiplied in kept 4, and the product kept its other operand too).
        let dropped = self.draw(&x);
        x.mask_fill(dropped, 0.0) * keep_scale(self.p)
    }

    /// `dropout(relu(x))` as one op: zero where `x ≤ 0` or dropped, then scale. Same values and
    /// gradient as the two ops (burn's ReLU passes no gradient at 0 either). In f32 on flex
    /// ([`dropout_op`]) backward keeps nothing but the output the next layer keeps anyway; elsewhere
    /// one masked fill keeps a 1-byte mask, where ReLU alone keeps its input.
    pub fn apply_after_relu<const D: usize>(&mut self, x: Tensor<D>) -> Tensor<D> {
        if dropout_op::supported(&x) {
            // With p = 0 the mask is all kept and nothing is drawn, as below.
            let n = if self.p > 0.0 {
                x.shape().num_elements()
            } else {
                0
            };
            let seed = self.mask_seed(n);
            return dropout_op::relu_dropout(x, seed, self.p);
        }
        let not_positive = x.clone().inner().lower_equal_elem(0.0);
        if self.p <= 0.0 {
            return x.mask_fill(not_positive, 0.0);
        }
        let dropped = self.draw(&x);
        x.mask_fill(not_positive.bool_or(dropped), 0.0) * keep_scale(self.p)
    }

    /// The next mask for `like`: `true` where an element is dropped. Drawn on `like`'s device by
    /// its backend's generator (on a GPU, no mask crosses the bus), which is reseeded from this
    /// dropout's stream for every mask: a clone replays the masks, a resumed run redraws them. The
    /// masks are the backend's, not [`fill_dropped`]'s: a GPU and the CPU drop different elements.
    fn draw<const D: usize>(&mut self, like: &Tensor<D>) -> Tensor<D, Bool> {
        // Every backend's generator is process-wide: another thread's seed must not come between
        // this seed and this draw (data-parallel ranks are threads). memfit's CUDA build runs
        // without burn's fusion, so the draw is launched, and its seed read, before the lock goes.
        static DRAWING: Mutex<()> = Mutex::new(());
        let seed = self.mask_seed(like.shape().num_elements());
        let _alone = DRAWING.lock().unwrap_or_else(PoisonError::into_inner);
        like.device().seed(seed);
        like.random_like(Distribution::Bernoulli(self.p))
            .greater_elem(0.5)
    }

    /// The seed of the next mask, of `n` elements (the generator's state: the flex ops draw the mask
    /// from it as [`fill_dropped`] does, [`Self::draw`] seeds the backend with it), advancing past
    /// those draws so that masks follow one stream whichever path draws them.
    fn mask_seed(&mut self, n: usize) -> u64 {
        let seed = self.rng.0;
        self.rng.skip(n.div_ceil(2) as u64);
        seed
    }

    /// For an op that applies this dropout to `x` itself ([`crate::kernels::dropout_linear_op`]):
    /// the seed and probability of the mask [`Self::apply`] would draw for `x` next, advancing past
    /// it; `None` where `apply` would not draw one (p = 0) or the op does not run (flex's
    /// hand-written path only: [`crate::kernels::flex_values::is_flex_float`]).
    pub fn next_mask_for<const D: usize>(&mut self, x: &Tensor<D>) -> Option<(u64, f64)> {
        if self.p <= 0.0 || !crate::kernels::flex_values::is_flex_float(x) {
            return None;
        }
        Some((self.mask_seed(x.shape().num_elements()), self.p))
    }

    /// A seed for an operation that draws its own mask ([`fill_dropped`] from `SplitMix64::new`),
    /// advancing this generator so that later masks differ; clones replay the same seeds.
    pub fn next_seed(&mut self) -> u64 {
        self.rng.next_u64()
    }

    pub fn p(&self) -> f64 {
        self.p
    }
}

/// Inverted dropout in place (the forward values, or their gradient): zero the elements dropped by
/// the mask [`fill_dropped`] draws from `SplitMix64::new(seed)`, scale the kept ones by `1/(1−p)`.
pub fn drop_and_scale(values: &mut [f32], seed: u64, p: f64) {
    if p <= 0.0 {
        return;
    }
    // The mask `fill_dropped` draws, drawn and applied in one pass (each pair's u64 from its index).
    let threshold = keep_threshold(p);
    let scale = keep_scale(p) as f32;
    let apply = |x: f32, bits: u64| if bits >= threshold { 0.0 } else { x * scale };
    let mut pairs = values.chunks_exact_mut(2);
    let mut i = 0;
    for pair in &mut pairs {
        let r = SplitMix64::output(seed, i);
        pair[0] = apply(pair[0], r & 0xFFFF_FFFF);
        pair[1] = apply(pair[1], r >> 32);
        i += 1;
    }
    if let [last] = pairs.into_remainder() {
        *last = apply(*last, SplitMix64::output(seed, i) & 0xFFFF_FFFF);
    }
}

/// A 32-bit draw at or above this drops its element: P = p.
pub(crate) fn keep_threshold(p: f64) -> u64 {
    ((1.0 - p) * 4_294_967_296.0) as u64
}

/// The factor inverted dropout scales kept elements by: `1/(1−p)`.
pub fn keep_scale(p: f64) -> f64 {
    1.0 / (1.0 - p)
}

/// Draws one dropout mask into `dropped` (`true`: dropped with probability `p`): each u64 gives two
/// elements, its 32-bit halves compared with the keep threshold. The flex ops' mask, written out:
/// they draw it fused with its use ([`drop_and_scale`]) and are held to this in tests.
pub fn fill_dropped(rng: &mut SplitMix64, p: f64, dropped: &mut [bool]) {
    let threshold = keep_threshold(p);
    for pair in dropped.chunks_mut(2) {
        let r = rng.next_u64();
        pair[0] = r & 0xFFFF_FFFF >= threshold;
        if let Some(second) = pair.get_mut(1) {
            *second = r >> 32 >= threshold;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;
    use burn::tensor::activation::relu;

    #[test]
    fn outputs_by_position_equal_the_sequence_and_the_fused_mask_equals_fill_dropped() {
        let mut rng = SplitMix64::new(99);
        for i in 0..1000 {
            assert_eq!(SplitMix64::output(99, i), rng.next_u64());
        }
        for (n, p) in [(1, 0.5), (7, 0.1), (1000, 0.3)] {
            let mut dropped = vec![false; n];
            fill_dropped(&mut SplitMix64::new(5), p, &mut dropped);
            let mut values = vec![1.0f32; n];
            drop_and_scale(&mut values, 5, p);
            for (v, d) in values.iter().zip(&dropped) {
                assert_eq!(*v == 0.0, *d, "n {n}, p {p}");
            }
        }
    }

    #[test]
    fn relu_then_dropout_as_one_mask_gives_the_same_values_and_gradient() {
        let device = Device::flex();
        let values: Vec<f32> = (0..64)
            .map(|i| ((i * 13 % 11) as f32 - 5.0) / 2.0)
            .collect();
        assert!(values.contains(&0.0), "the tie at 0 is covered");
        let weights: Vec<f32> = (0..64).map(|i| (i % 7) as f32 - 3.0).collect();
        let w = Tensor::<2>::from_data(TensorData::new(weights, [8, 8]), &device);
        for p in [0.0, 0.3] {
            let run = |fused: bool| -> (Vec<f32>, Vec<f32>) {
                let x = Tensor::<2>::from_data(TensorData::new(values.clone(), [8, 8]), &device)
                    .autodiff()
                    .require_grad();
                let mut drop = Dropout::new(7, p);
                let y = if fused {
                    drop.apply_after_relu(x.clone())
                } else {
                    drop.apply(relu(x.clone()))
                };
                let grads = (y.clone() * w.clone()).sum().backward();
                let grad = x.grad(&grads).unwrap().into_data().try_to_vec().unwrap();
                (y.inner().into_data().try_to_vec().unwrap(), grad)
            };
            assert_eq!(run(true), run(false), "p = {p}");
        }
    }

    /// burn's portable backend takes the path a GPU takes: the mask drawn by the backend.
    #[allow(deprecated)]
    fn portable() -> Device {
        Device::ndarray()
    }

    fn dropped_on_portable(dropout: &mut Dropout, n: usize) -> Vec<bool> {
        dropped_on(&portable(), dropout, n)
    }

    fn dropped_on(device: &Device, dropout: &mut Dropout, n: usize) -> Vec<bool> {
        let x = Tensor::<1>::ones([n], device);
        let y: Vec<f32> = dropout.apply(x).into_data().try_to_vec().unwrap();
        let scale = keep_scale(dropout.p()) as f32;
        y.iter()
            .map(|&v| {
                assert!(
                    v == 0.0 || (v - scale).abs() < 1e-6,
                    "kept {v}, not 1/(1-p)"
                );
                v == 0.0
            })
            .collect()
    }

    #[test]
    fn masks_drawn_by_the_backend_follow_the_seed_and_replay_in_clones() {
        let n = 20_000;
        let mut first = Dropout::new(7, 0.3);
        let replay = first.clone();
        let a = dropped_on_portable(&mut first, n);
        let b = dropped_on_portable(&mut first, n);
        assert_ne!(a, b, "the next mask is a new draw");
        let share = a.iter().filter(|d| **d).count() as f64 / n as f64;
        assert!((share - 0.3).abs() < 0.02, "dropped {share}, p 0.3");
        // Another thread drawing all the while changes nothing (ranks are threads).
        let noise = std::thread::spawn(|| {
            let mut other = Dropout::new(1, 0.5);
            for _ in 0..50 {
                dropped_on_portable(&mut other, 1000);
            }
        });
        let mut replay = replay;
        for _ in 0..20 {
            let mut again = replay.clone();
            assert_eq!(dropped_on_portable(&mut again, n), a);
        }
        noise.join().unwrap();
        assert_eq!(dropped_on_portable(&mut replay, n), a);
        assert_eq!(dropped_on_portable(&mut replay, n), b);
    }

    #[test]
    fn the_backend_mask_passes_the_gradient_of_kept_elements_only() {
        let x = Tensor::<1>::ones([4096], &portable())
            .autodiff()
            .require_grad();
        let y = Dropout::new(3, 0.5).apply_after_relu(x.clone());
        let kept: Vec<f32> = y.clone().inner().into_data().try_to_vec().unwrap();
        let grads = y.sum().backward();
        let grad: Vec<f32> = x.grad(&grads).unwrap().into_data().try_to_vec().unwrap();
        assert_eq!(
            kept, grad,
            "d(sum)/dx is the kept scale where kept, 0 where dropped"
        );
        assert!(kept.contains(&0.0) && kept.contains(&2.0));
    }

    /// Built with `--features wgpu`: cubecl's Bernoulli kernel (CUDA's too) on burn's wgpu backend
    /// (here Mesa's software renderer) replays a mask from its seed and drops at the rate asked.
    #[cfg(feature = "wgpu")]
    #[test]
    fn masks_drawn_by_cubecl_follow_the_seed() {
        let device = Device::wgpu(burn::tensor::DeviceKind::default());
        let mut first = Dropout::new(11, 0.25);
        let replay = first.clone();
        let a = dropped_on(&device, &mut first, 50_000);
        let b = dropped_on(&device, &mut first, 50_000);
        assert_ne!(a, b);
        let share = a.iter().filter(|d| **d).count() as f64 / a.len() as f64;
        assert!((share - 0.25).abs() < 0.01, "dropped {share}, p 0.25");
        assert_eq!(dropped_on(&device, &mut replay.clone(), 50_000), a);
    }
}
