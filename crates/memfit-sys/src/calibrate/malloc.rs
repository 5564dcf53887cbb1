//! glibc's malloc, pinned for the trials and for the profiles calibrate writes.
//!
//! glibc serves requests at or above its mmap threshold with their own mappings, returned to the
//! kernel on `free`, and the rest from its heaps, which keep freed memory. The threshold is dynamic
//! (mallopt(3), `M_MMAP_THRESHOLD`): each time a mapped chunk is freed it rises to that chunk's size,
//! up to `DEFAULT_MMAP_THRESHOLD_MAX` (32 MiB on 64-bit). A training step frees tensors of every
//! size up to its largest activations, so the threshold climbs as the batch grows and more of them
//! come from heaps that stay resident: the RSS per sample steepens with the batch (t5-small under
//! `bench_t5.py`: 146 MiB per sample from batch 1 to 4, 219 from 8 to 16; 175 from 4 to 16 with the
//! threshold pinned; docs/benchmarks.md). Setting the threshold disables the adjustment ("the
//! dynamic adjustment ... is disabled if any of M_TOP_PAD, M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, or
//! M_MMAP_MAX is set"), and glibc reads it from `MALLOC_MMAP_THRESHOLD_` at start-up. Calibrate pins
//! it at glibc's own initial value, 128 KiB, for every trial, and writes the same variable into each
//! profile, so that the run the measurements are for allocates as the trials did.

/// The variables calibrate sets: glibc's initial mmap threshold (`DEFAULT_MMAP_THRESHOLD_MIN`,
/// 128 KiB), fixed.
pub const MALLOC_PINS: &[(&str, &str)] = &[("MALLOC_MMAP_THRESHOLD_", "131072")];

/// The pins to apply, given the environment the command would inherit (`lookup`): none when the
/// user already tunes glibc's malloc (one of the variables, or `GLIBC_TUNABLES` naming
/// `glibc.malloc`), which is then what the trials measure.
pub fn malloc_pins(lookup: impl Fn(&str) -> Option<String>) -> Vec<(String, String)> {
    let tuned = MALLOC_PINS.iter().any(|(k, _)| lookup(k).is_some())
        || lookup("GLIBC_TUNABLES").is_some_and(|t| t.contains("glibc.malloc"));
    if tuned {
        return Vec::new();
    }
    MALLOC_PINS
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_unless_the_user_tunes_malloc() {
        let none = |_: &str| None;
        assert_eq!(
            malloc_pins(none),
            vec![("MALLOC_MMAP_THRESHOLD_".to_string(), "131072".to_string())]
        );
        let own = |k: &str| (k == "MALLOC_MMAP_THRESHOLD_").then(|| "65536".to_string());
        assert!(malloc_pins(own).is_empty());
        let tunables =
            |k: &str| (k == "GLIBC_TUNABLES").then(|| "glibc.malloc.trim_threshold=0".to_string());
        assert!(malloc_pins(tunables).is_empty());
        let other = |k: &str| (k == "GLIBC_TUNABLES").then(|| "glibc.cpu.hwcaps=-AVX".to_string());
        assert_eq!(malloc_pins(other).len(), 1);
    }
}
