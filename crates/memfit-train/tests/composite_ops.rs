//! The GPU's code path in bf16, checked on the CPU: with the hand-written CPU ops off
//! (`MEMFIT_CPU_KERNELS=off`), flex runs burn's ops and the device ops (memfit-nn
//! `kernels/device`) with bf16 weights — what cubecl runs on a GPU — and each family trains as the
//! CPU's own mixed precision does. (It has its own test
//! binary: the switch holds for the whole process.) On an H100 these once differed: an f32 × bf16
//! matmul in the LM head read as garbage (T5 4% off from step 1, the LoRA run NaN).

mod engine_fixtures;

use engine_fixtures::*;
use memfit_nn::bert::BertModel;
use memfit_nn::kernels::set_composite_ops_on_cpu;
use memfit_nn::model::TrainModel;
use memfit_nn::t5::T5Model;
use memfit_train::engine::{Backend, ModelEngine, Placement, Precision};

/// The switch holds for the whole process: one test at a time flips it.
static SWITCH: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `STEPS` losses of `model` in bf16 with the state on the device: on the hand-written ops, then on
/// burn's composite ones.
fn both_paths<M: TrainModel>(model: impl Fn() -> M, batches: &[M::Batch]) -> (Vec<f32>, Vec<f32>) {
    let losses = |composite| {
        set_composite_ops_on_cpu(composite);
        let mut opts = options(Backend::Flex, Placement::Device, adamw());
        opts.precision = Precision::Bf16;
        let mut engine = ModelEngine::new(model(), opts).unwrap();
        let losses = train(&mut engine, batches);
        set_composite_ops_on_cpu(false);
        losses
    };
    (losses(false), losses(true))
}

/// The first step (the same weights: only roundings differ — the CPU ops keep f32 where burn's
/// round to bf16) within `tol` relative, every loss finite, and the composite run learns as the
/// other does (the tiny models' steep descent carries bf16 runs apart after a few steps).
fn assert_close_then_learns(what: &str, cpu: &[f32], composite: &[f32], tol: f32) {
    let context = format!("{what}\ncpu ops:   {cpu:?}\ncomposite: {composite:?}");
    assert!(
        (cpu[0] - composite[0]).abs() <= tol * cpu[0].abs(),
        "{context}"
    );
    assert!(composite.iter().all(|l| l.is_finite()), "{context}");
    let learned = |l: &[f32]| l[0] - l[l.len() - 1];
    assert!(learned(composite) > 0.8 * learned(cpu), "{context}");
}

#[test]
fn every_family_trains_in_bf16_through_burns_composite_ops_as_through_the_cpu_ops() {
    let _switch = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let (cpu, composite) = both_paths(|| T5Model::init(t5_config(), 3), &t5_batches());
    assert_close_then_learns("t5", &cpu, &composite, 1e-2);
    let (cpu, composite) = both_paths(|| BertModel::init(bert_config(), 11), &bert_batches());
    assert_close_then_learns("bert", &cpu, &composite, 1e-2);
    let lora = || decoder_model(Backend::Flex.device()).unwrap();
    let (cpu, composite) = both_paths(lora, &decoder_batches());
    assert_close_then_learns("decoder lora", &cpu, &composite, 1e-2);
}

/// In fp32 the decoder on the GPU's code path — its attention fused (no dropout, right-padded rows
/// of several lengths: `decoder::attention::attend_causal_or_masked`), the probabilities recomputed
/// in backward — trains as the CPU's ops do, step for step.
#[test]
fn the_decoder_with_fused_attention_trains_as_the_cpu_ops_in_fp32() {
    let _switch = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let losses = |composite| {
        set_composite_ops_on_cpu(composite);
        let opts = options(Backend::Flex, Placement::Device, adamw());
        let mut engine =
            ModelEngine::new(decoder_model(Backend::Flex.device()).unwrap(), opts).unwrap();
        let losses = train(&mut engine, &decoder_batches());
        set_composite_ops_on_cpu(false);
        losses
    };
    let (cpu, composite) = (losses(false), losses(true));
    assert_same_losses("decoder lora, fused attention", &cpu, &composite, 1e-5);
}
