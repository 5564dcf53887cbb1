//! Invariants of the memory model over random setups (proptest).

use memfit_plan::arch::{PRESET_NAMES, preset};
use memfit_plan::memory::{self, Attention, Framework, Method, Precision, Setup, Zero};
use proptest::prelude::*;

fn setup_strategy() -> impl Strategy<Value = (usize, u64, u64, usize, bool, usize, bool)> {
    (
        0..PRESET_NAMES.len(),
        1u64..16,
        prop::sample::select(vec![64u64, 128, 256, 512]),
        0..3usize,
        any::<bool>(),
        0..3usize,
        any::<bool>(),
    )
}

fn build(
    i: usize,
    batch: u64,
    seq: u64,
    prec: usize,
    ckpt: bool,
    method: usize,
    sdpa: bool,
) -> (memfit_plan::arch::Arch, Setup) {
    let arch = preset(PRESET_NAMES[i]).unwrap();
    let mut s = Setup::new(&arch);
    s.batch = batch;
    s.seq = seq;
    s.tgt_seq = if s.tgt_seq > 0 { seq / 4 } else { 0 };
    s.precision = [Precision::Fp32, Precision::AmpBf16, Precision::Bf16][prec];
    s.grad_ckpt = ckpt;
    s.method = [Method::Full, Method::Lora, Method::Full][method];
    s.attention = if sdpa {
        Attention::Sdpa
    } else {
        Attention::Eager
    };
    let arch = arch.with_task(s.task);
    (arch, s)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn metrics_are_ordered((i, b, s, p, c, m, a) in setup_strategy()) {
        let (arch, setup) = build(i, b, s, p, c, m, a);
        let e = memory::estimate(&arch, &setup, &Framework::default()).unwrap();
        let g = e.gpu.unwrap();
        prop_assert!(g.peak_allocated_bytes <= g.peak_reserved_bytes);
        prop_assert!(g.peak_reserved_bytes < g.nvml_used_bytes);
        prop_assert!(e.host.train_rss_bytes <= e.host.peak_rss_bytes);
    }

    #[test]
    fn more_batch_or_sequence_never_needs_less((i, b, s, p, c, m, a) in setup_strategy()) {
        let fw = Framework::default();
        let (arch, setup) = build(i, b, s, p, c, m, a);
        let base = memory::estimate(&arch, &setup, &fw).unwrap().gpu.unwrap().peak_allocated_bytes;
        let mut bigger = setup.clone();
        bigger.batch += 1;
        prop_assert!(memory::estimate(&arch, &bigger, &fw).unwrap().gpu.unwrap().peak_allocated_bytes >= base);
        let mut longer = setup.clone();
        longer.seq *= 2;
        prop_assert!(memory::estimate(&arch, &longer, &fw).unwrap().gpu.unwrap().peak_allocated_bytes >= base);
    }

    #[test]
    fn savings_features_save((i, b, s, p, _c, _m, _a) in setup_strategy()) {
        let fw = Framework::default();
        let (arch, setup) = build(i, b, s, p, false, 0, false);
        let need = |s: &Setup| memory::estimate(&arch, s, &fw).unwrap().gpu.unwrap().peak_allocated_bytes;
        let base = need(&setup);
        let mut ckpt = setup.clone();
        ckpt.grad_ckpt = true;
        prop_assert!(need(&ckpt) <= base);
        // A fused kernel saves its output (heads × head_dim per token) plus a logsumexp per head
        // instead of eager's probabilities (heads × seq per token): it saves memory only once the
        // sequence is longer than a head. At seq = head_dim it costs the logsumexp more.
        if setup.seq > arch.head_dim {
            let mut sdpa = setup.clone();
            sdpa.attention = Attention::Sdpa;
            prop_assert!(need(&sdpa) <= base);
        }
        let mut lora = setup.clone();
        lora.method = Method::Lora;
        prop_assert!(need(&lora) <= base);
        let mut z3 = setup.clone();
        z3.zero = Zero::Z3;
        z3.offload_optimizer = true;
        z3.offload_params = true;
        let full_states = arch.params_total() * setup.precision.weight_bytes();
        // offloading everything leaves at most the gathered working set on the GPU
        prop_assert!(need(&z3) < base + full_states);
    }
}
