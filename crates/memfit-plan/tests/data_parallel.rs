//! The data-parallel throughput model (`search::data_parallel`): bytes on the link, overlap, speed-up.

use memfit_plan::arch::{Arch, preset};
use memfit_plan::memory::{Precision, Runtime, Setup, Zero};
use memfit_plan::search::data_parallel::{DDP_BUCKET_BYTES, comm, one_gpu, scaling};
use memfit_plan::search::throughput::step_time;

/// The seed's ChatLM T5 on `gpus` GPUs of one node, effective batch 96 at micro-batch 16.
fn setup(gpus: u64, runtime: Runtime) -> (Arch, Setup) {
    let arch = preset("chatlm-mini").unwrap();
    let mut s = Setup::new(&arch);
    (s.gpus, s.batch, s.runtime) = (gpus, 16, runtime);
    s.accum = 96 / (16 * gpus);
    s.precision = if runtime == Runtime::Memfit {
        Precision::Fp32
    } else {
        Precision::AmpBf16
    };
    (arch, s)
}

#[test]
fn one_gpu_has_no_communication_and_no_speedup() {
    for runtime in [Runtime::Memfit, Runtime::Pytorch] {
        let (arch, s) = setup(1, runtime);
        let sc = scaling(&arch, &s);
        assert_eq!(sc.comm.allreduce_bytes_per_step, 0.0);
        assert_eq!(sc.comm.exposed_s(), 0.0);
        assert!((sc.speedup_vs_one_gpu - 1.0).abs() < 1e-12, "{sc:?}");
    }
}

#[test]
fn ring_bytes_are_two_w_minus_one_over_w_of_the_f32_gradients_for_memfit() {
    let (arch, s2) = setup(2, Runtime::Memfit);
    let (_, s3) = setup(3, Runtime::Memfit);
    let grads = arch.params_total() as f64 * 4.0; // full fine-tuning: every weight trains, f32
    let b2 = comm(&arch, &s2, 1.0).allreduce_bytes_per_step;
    let b3 = comm(&arch, &s3, 1.0).allreduce_bytes_per_step;
    assert!(
        (b2 - grads).abs() / grads < 1e-9,
        "2 ranks: {b2} vs {grads}"
    );
    assert!(
        (b3 - grads * 4.0 / 3.0).abs() / grads < 1e-9,
        "3 ranks: {b3}"
    );
}

#[test]
fn memfit_overlaps_only_with_checkpointing_and_pytorch_does() {
    let (arch, mut m) = setup(3, Runtime::Memfit);
    let (_, p) = setup(3, Runtime::Pytorch);
    // without per-block checkpointing memfit's backward is one pass: the reduce runs after it
    m.grad_ckpt = false;
    let cm = step_time(&arch, &m).comm;
    assert_eq!(cm.overlap, 0.0);
    assert_eq!(cm.exposed_s(), cm.allreduce_s_per_step);
    let cp = step_time(&arch, &p).comm;
    assert!(cp.overlap > 0.0 && cp.overlap < 1.0, "{cp:?}");
    assert!(cp.exposed_s() < cp.allreduce_s_per_step);
    // with it, block by block: hidden except the tail (the shared embedding and one block)
    m.grad_ckpt = true;
    let cm = step_time(&arch, &m).comm;
    assert!(cm.overlap > 0.0 && cm.overlap < 1.0, "{cm:?}");
    let endless = comm(&arch, &m, 1e9);
    let grads = arch.params_total() as f64 * 4.0;
    let embedding = (arch.vocab * arch.hidden) as f64 * 4.0;
    let blocks = (arch.encoder_layers + arch.decoder_layers) as f64;
    let tail = (embedding + (grads - embedding) / blocks) / grads;
    assert!(
        (1.0 - endless.overlap - tail).abs() < 1e-6,
        "{endless:?} vs tail {tail}"
    );
}

#[test]
fn the_last_bucket_is_never_hidden() {
    let (arch, p) = setup(3, Runtime::Pytorch);
    // an infinitely long backward still leaves the last 25 MiB bucket after it
    let c = comm(&arch, &p, 1e9);
    let grads = arch.params_total() as f64 * 4.0;
    let last = DDP_BUCKET_BYTES / grads;
    assert!((1.0 - c.overlap - last).abs() < 1e-9, "{c:?}");
    // no backward to hide behind: nothing hidden
    assert_eq!(comm(&arch, &p, 0.0).overlap, 0.0);
}

#[test]
fn the_speedup_is_below_the_rank_count_and_falls_with_slower_links() {
    for runtime in [Runtime::Memfit, Runtime::Pytorch] {
        let (arch, s) = setup(3, runtime);
        let sc = scaling(&arch, &s);
        assert!(
            sc.speedup_vs_one_gpu > 1.0 && sc.speedup_vs_one_gpu < 3.0,
            "{runtime}: {sc:?}"
        );
        // the same 3 ranks spread over 3 nodes talk over the slower inter-node link
        let mut spread = s.clone();
        (spread.gpus, spread.nodes) = (1, 3);
        let far = scaling(&arch, &spread);
        assert!(far.comm.link_bytes_per_s < sc.comm.link_bytes_per_s);
        assert!(
            far.speedup_vs_one_gpu < sc.speedup_vs_one_gpu,
            "{runtime}: {far:?} vs {sc:?}"
        );
    }
}

#[test]
fn efficiency_falls_as_ranks_grow_at_a_fixed_effective_batch() {
    for runtime in [Runtime::Memfit, Runtime::Pytorch] {
        let efficiency = |gpus: u64| {
            let (arch, s) = setup(gpus, runtime);
            scaling(&arch, &s).speedup_vs_one_gpu / gpus as f64
        };
        let (e2, e3, e6) = (efficiency(2), efficiency(3), efficiency(6));
        assert!(e2 > e3 && e3 > e6, "{runtime}: {e2} {e3} {e6}");
    }
}

#[test]
fn overlap_gives_pytorch_the_better_scaling_on_the_same_setup() {
    // same precision and batch; only the runtime's reduce differs (f32 gradients both: fp32 weights),
    // memfit's not overlapped (no checkpointing)
    let (arch, mut p) = setup(3, Runtime::Pytorch);
    p.precision = Precision::Fp32;
    let mut m = p.clone();
    m.runtime = Runtime::Memfit;
    m.grad_ckpt = false;
    let (sp, sm) = (scaling(&arch, &p), scaling(&arch, &m));
    assert_eq!(
        sp.comm.allreduce_bytes_per_step,
        sm.comm.allreduce_bytes_per_step
    );
    assert!(
        sp.speedup_vs_one_gpu > sm.speedup_vs_one_gpu,
        "{sp:?} {sm:?}"
    );
}

#[test]
fn zero3_gathers_are_charged_and_the_one_gpu_reference_holds_the_batch() {
    let (arch, mut s) = setup(3, Runtime::Pytorch);
    s.zero = Zero::Z3;
    let c = step_time(&arch, &s).comm;
    assert!(c.gather_s_per_step > 0.0);
    let one = one_gpu(&s);
    assert_eq!(one.world(), 1);
    assert_eq!(one.effective_batch(), s.effective_batch());
}
