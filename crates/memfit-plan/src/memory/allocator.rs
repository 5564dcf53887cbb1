//! Reserved memory when sequence lengths vary from step to step (`Setup::length_spread`).
//!
//! PyTorch's caching allocator (c10/cuda/CUDACachingAllocator.cpp) serves a request from the
//! smallest cached free block at least as large (`get_free_block`, best fit); a block never
//! grows and a segment never merges with another (`try_merge_blocks` joins neighbours inside one
//! segment only), and a request of `kMinLargeAlloc` (10 MiB) or more gets a segment of its own,
//! `cudaMalloc`ed at the request rounded up to `kRoundLarge` (2 MiB). So the step-sized tensors
//! of a shorter step (block inputs, logits, the loss's copies) stay cached in segments too small
//! for the same tensors of a longer step, which `cudaMalloc`s new ones beside them: the peak
//! reserved holds both generations (nothing calls `empty_cache`; the allocator frees cached
//! segments only when a `cudaMalloc` fails). The earlier generation is taken at the mean length
//! of a spread drawn evenly between the shortest and the longest step, `seq · (1 + spread) / 2`:
//! the segments a typical earlier step left.
//!
//! With `expandable_segments:True` a stream's large pool is one segment that grows by mapping
//! 20 MiB granules at its end (`ExpandableSegment::map`; 2 MiB for the small pool), and freed
//! blocks merge across what were separate allocations, so a longer step reuses the shorter one's
//! range: no second generation.
//!
//! `caching_allocator.rs` replays the allocator's rules on a sequence of requests; a model of
//! the pool over many steps waits for a card's traces to check it against (docs/accuracy.md).

use super::activations::activations;
use super::framework::{Framework, LARGE_SEGMENT_ROUND, MIN_LARGE_ALLOC};
use super::setup::{Device, Setup};
use crate::arch::Arch;

/// Whether shorter steps leave segments cached beside the longest's: lengths vary, on a CUDA GPU,
/// without expandable segments.
fn shorter_steps_strand_segments(setup: &Setup) -> bool {
    !setup.expandable_segments && setup.length_spread < 1.0 && setup.device == Device::Cuda
}

/// Bytes reserved beyond the longest step's peak by the segments shorter steps left cached.
pub fn length_spread_reserved(arch: &Arch, setup: &Setup, fw: &Framework) -> u64 {
    if !shorter_steps_strand_segments(setup) {
        return 0;
    }
    let mean = |len: u64| ((len as f64) * (1.0 + setup.length_spread) / 2.0).ceil() as u64;
    let mut earlier = setup.clone();
    earlier.seq = mean(setup.seq).max(1);
    earlier.tgt_seq = mean(setup.tgt_seq);
    step_segments(arch, &earlier, fw)
}

/// What a user planning varying lengths without expandable segments should know: the pool is
/// counted as one earlier step's segments, and the published runs that vary their lengths
/// reserved more (ms-swift's rows, docs/accuracy.md). `None` when the lengths are fixed, the
/// segments expand, or the device is not a CUDA GPU.
pub fn length_spread_caveat(setup: &Setup) -> Option<String> {
    if !shorter_steps_strand_segments(setup) {
        return None;
    }
    Some(format!(
        "lengths vary (--length-spread {}): the caching allocator's segments of shorter steps are \
         counted as one earlier step's, and published runs reserved more (ms-swift's Qwen LoRA \
         rows at 1.8B: 2.6 to 18 GiB more at 512 to 8,192 tokens; docs/accuracy.md). With \
         PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (and --expandable-segments here) \
         segments grow in place instead; that case is not yet measured against the estimate",
        setup.length_spread
    ))
}

/// The segments of one step's own-segment allocations: each block's saved tensors (the
/// activation total split evenly over the blocks), the recomputed block, the embeddings, the
/// logits with the loss's copies, the loss backward's temporaries — each a request of its own;
/// those under `MIN_LARGE_ALLOC` share 20 MiB segments that any later step reuses.
fn step_segments(arch: &Arch, setup: &Setup, fw: &Framework) -> u64 {
    let act = activations(arch, setup, fw);
    let layers = arch.layers_total().max(1);
    let per_block = act.blocks / layers;
    let per_block_segments = layers * own_segment(per_block);
    per_block_segments
        + [act.recompute, act.embeddings, act.logits, act.transient]
            .into_iter()
            .map(own_segment)
            .sum::<u64>()
}

fn own_segment(bytes: u64) -> u64 {
    if bytes < MIN_LARGE_ALLOC {
        0
    } else {
        bytes.div_ceil(LARGE_SEGMENT_ROUND) * LARGE_SEGMENT_ROUND
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch;
    use crate::memory::setup::{Attention, Method, Precision};

    fn setup(arch: &Arch, spread: f64, expandable: bool) -> Setup {
        let mut s = Setup::new(arch);
        s.batch = 1;
        s.seq = 4096;
        s.precision = Precision::AmpBf16;
        s.method = Method::Lora;
        s.grad_ckpt = true;
        s.attention = Attention::Sdpa;
        s.length_spread = spread;
        s.expandable_segments = expandable;
        s
    }

    fn reserved(arch: &Arch, s: &Setup) -> u64 {
        crate::memory::gpu::gpu(arch, s, &Framework::default()).peak_reserved_bytes
    }

    /// Without expandable segments the peak reserved grows once lengths vary (the earlier
    /// steps' segments stay cached beside the longest step's), and by no more than one earlier
    /// step's step-sized tensors; with them it does not move.
    #[test]
    fn reserved_grows_with_spread_only_without_expandable_segments() {
        let arch = arch::preset("llama-2-7b").unwrap();
        let fixed = reserved(&arch, &setup(&arch, 1.0, false));
        let half = reserved(&arch, &setup(&arch, 0.5, false));
        let narrow = reserved(&arch, &setup(&arch, 0.9, false));
        assert!(half > fixed, "{half} <= {fixed}");
        assert!(
            narrow > half,
            "{narrow} <= {half}: a narrower spread leaves larger segments"
        );
        let step = step_segments(&arch, &setup(&arch, 1.0, false), &Framework::default());
        assert!(
            narrow - fixed <= step,
            "{} > one step {step}",
            narrow - fixed
        );
        for spread in [1.0, 0.9, 0.5, 0.1] {
            assert_eq!(
                reserved(&arch, &setup(&arch, spread, true)),
                fixed,
                "{spread}"
            );
        }
    }

    /// The caveat comes with varying lengths on a CUDA GPU and goes with expandable segments or
    /// fixed lengths.
    #[test]
    fn varying_lengths_carry_a_caveat_unless_segments_expand() {
        let arch = arch::preset("llama-2-7b").unwrap();
        let caveat = |spread, expandable| length_spread_caveat(&setup(&arch, spread, expandable));
        assert!(caveat(0.1, false).is_some_and(|c| c.contains("--length-spread 0.1")));
        assert_eq!(caveat(0.1, true), None);
        assert_eq!(caveat(1.0, false), None);
    }

    /// Requests under 10 MiB share 20 MiB segments and leave nothing of their own; larger ones
    /// are rounded up to 2 MiB.
    #[test]
    fn own_segments_follow_the_allocator_rounding() {
        assert_eq!(own_segment(MIN_LARGE_ALLOC - 1), 0);
        assert_eq!(
            own_segment(MIN_LARGE_ALLOC + 1),
            MIN_LARGE_ALLOC + LARGE_SEGMENT_ROUND
        );
        assert_eq!(
            own_segment(12 * LARGE_SEGMENT_ROUND / 2),
            6 * LARGE_SEGMENT_ROUND
        );
    }
}
