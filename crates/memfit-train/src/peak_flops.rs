//! One core's peak arithmetic rate, measured on the core itself: what `memfit bench train`'s MFU
//! divides by.
//!
//! A table of "FLOP per cycle × clock" is wrong too often to report against: cpuinfo shows a VM's
//! nominal clock, not the boost the core runs at, and AVX-512 parts differ in how many 512-bit FMAs
//! they issue per cycle (two on Xeon Scalable, one — two 256-bit halves — on AMD Zen 4). So the
//! rate is measured: independent multiply-adds in registers for a few tens of milliseconds, the
//! best of three rounds. f32 uses the widest FMA the CPU has; bf16 uses the instruction memfit's
//! bf16 products run on ([`memfit_nn::kernels::gemm_bf16`]): AMX's tile dot product where the CPU
//! has AMX, else AVX512-BF16's (two products and two adds per f32 lane), else the f32 rate.

use std::time::Instant;

/// Each measuring round runs for at least this long.
const ROUND_SECONDS: f64 = 0.03;

/// The peak FLOP/s of one core for `bf16` products (else f32), and what it was measured with.
pub fn peak_flops_per_core(bf16: bool) -> (f64, &'static str) {
    #[cfg(target_arch = "x86_64")]
    {
        if bf16 && memfit_nn::kernels::gemm_bf16::uses_amx() {
            let dot = memfit_nn::kernels::gemm_bf16::amx_dot_products;
            return (best_rate(dot), "measured: AMX tile dot products");
        }
        if bf16 && memfit_nn::kernels::gemm_bf16::hardware_bf16() {
            return (
                best_rate(x86::bf16_dot),
                "measured: AVX512-BF16 dot products",
            );
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            return (best_rate(x86::fma512), "measured: AVX-512 f32 FMA");
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return (best_rate(x86::fma256), "measured: AVX2 f32 FMA");
        }
    }
    let _ = bf16;
    (best_rate(portable_fma), "measured: f32 mul_add (portable)")
}

/// FLOP/s of `kernel(iterations) -> flops`, the best of three rounds.
fn best_rate(kernel: fn(u64) -> f64) -> f64 {
    let mut iterations = 1u64 << 10;
    // grow the round until it lasts ROUND_SECONDS
    loop {
        let start = Instant::now();
        kernel(iterations);
        if start.elapsed().as_secs_f64() >= ROUND_SECONDS || iterations >= 1 << 40 {
            break;
        }
        iterations *= 2;
    }
    (0..3)
        .map(|_| {
            let start = Instant::now();
            let flops = kernel(iterations);
            flops / start.elapsed().as_secs_f64()
        })
        .fold(0.0, f64::max)
}

/// 8 independent chains of 8-lane f32 multiply-adds: what the compiler makes of portable code.
fn portable_fma(iterations: u64) -> f64 {
    let mut acc = [[1.0f32; 8]; 8];
    let (a, b) = (
        std::hint::black_box(0.999_999f32),
        std::hint::black_box(1e-7f32),
    );
    for _ in 0..iterations {
        for chain in &mut acc {
            for x in chain.iter_mut() {
                *x = x.mul_add(a, b);
            }
        }
    }
    std::hint::black_box(acc);
    iterations as f64 * 64.0 * 2.0
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Independent accumulators: enough to cover the FMA latency on two pipes.
    const CHAINS: usize = 12;

    pub fn fma512(iterations: u64) -> f64 {
        #[target_feature(enable = "avx512f")]
        unsafe fn run(iterations: u64) {
            let (a, b) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
            let mut acc = [_mm512_set1_ps(1.0); CHAINS];
            for _ in 0..iterations {
                for x in &mut acc {
                    *x = _mm512_fmadd_ps(*x, a, b);
                }
            }
            std::hint::black_box(acc);
        }
        // SAFETY: called only where AVX-512 F was detected.
        unsafe { run(iterations) };
        iterations as f64 * (CHAINS * 16 * 2) as f64
    }

    pub fn fma256(iterations: u64) -> f64 {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn run(iterations: u64) {
            let (a, b) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
            let mut acc = [_mm256_set1_ps(1.0); CHAINS];
            for _ in 0..iterations {
                for x in &mut acc {
                    *x = _mm256_fmadd_ps(*x, a, b);
                }
            }
            std::hint::black_box(acc);
        }
        // SAFETY: called only where AVX2 and FMA were detected.
        unsafe { run(iterations) };
        iterations as f64 * (CHAINS * 8 * 2) as f64
    }

    pub fn bf16_dot(iterations: u64) -> f64 {
        #[target_feature(enable = "avx512f,avx512bf16")]
        unsafe fn run(iterations: u64) {
            // (1.0, 1.0) bf16 pairs; the sums grow without overflowing in any measured time
            let pair: __m512bh = unsafe { std::mem::transmute(_mm512_set1_epi32(0x3F80_3F80)) };
            let tiny: __m512bh = unsafe { std::mem::transmute(_mm512_set1_epi32(0x3380_3380)) };
            let mut acc = [_mm512_setzero_ps(); CHAINS];
            for _ in 0..iterations {
                for x in &mut acc {
                    *x = _mm512_dpbf16_ps(*x, pair, tiny);
                }
            }
            std::hint::black_box(acc);
        }
        // SAFETY: called only where `hardware_bf16` holds.
        unsafe { run(iterations) };
        // per lane: two products and two additions
        iterations as f64 * (CHAINS * 16 * 4) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Only plausibility: the two are timed at different moments, so on a loaded machine either
    // can come out slower (comparing them here failed under a parallel build).
    #[test]
    fn the_measured_peaks_are_plausible() {
        for bf16 in [false, true] {
            let (peak, how) = peak_flops_per_core(bf16);
            // any core of this century: between 1 GFLOP/s and 1 TFLOP/s, up to 10 with a
            // matrix unit (AMX: 16,384 FLOPs an instruction)
            let most = if how.contains("AMX") { 1e13 } else { 1e12 };
            assert!((1e9..most).contains(&peak), "{peak} ({how})");
        }
    }
}
