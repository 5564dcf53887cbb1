//! Plain loops compiled for AVX-512 where the CPU has it: x86-64's baseline build has SSE2 only,
//! so an elementwise loop over a whole tensor (conversions, optimizer updates, norms) runs four
//! lanes wide unless the function holding it is compiled for more.

/// `f()`, compiled for AVX512-F and -BW where the CPU has them: the loops `f` holds (inlined into
/// the AVX-512 function) vectorise sixteen f32 lanes wide.
#[inline(always)]
pub fn with_avx512<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
    {
        #[target_feature(enable = "avx512f,avx512bw")]
        fn run<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        // SAFETY: the CPU has AVX512-F and -BW (checked above).
        return unsafe { run(f) };
    }
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_result_is_the_closures() {
        let v: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        let doubled = with_avx512(|| v.iter().map(|x| 2.0 * x).collect::<Vec<f32>>());
        assert_eq!(doubled[999], 1998.0);
        assert_eq!(doubled.len(), 1000);
    }
}
