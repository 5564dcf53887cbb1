//! Training stacks (`memory/stack.rs`): each switch changes the estimate by the amount its rule
//! fixes, checked on small llama configs whose sizes make the amounts exact.

use memfit_plan::Task;
use memfit_plan::arch::{self, Arch, Head, Role};
use memfit_plan::memory::stack::{Loss, model_view};
use memfit_plan::memory::{
    self, Attention, Framework, LoraTarget, Method, Optimizer, Precision, Quant, Setup, Stack, Zero,
};
use serde_json::json;

const H: u64 = 256;
const LAYERS: u64 = 4;
const VOCAB: u64 = 32_000;

fn llama(tied: bool) -> Arch {
    let v = json!({"model_type": "llama", "hidden_size": H, "intermediate_size": 688,
        "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": LAYERS,
        "vocab_size": VOCAB, "tie_word_embeddings": tied});
    arch::parse_config("t.json", &v.to_string(), "t").unwrap()
}

fn lora(a: &Arch, stack: Stack) -> Setup {
    let mut s = Setup::new(a);
    s.task = Task::CausalLm;
    (s.batch, s.seq, s.precision) = (2, 128, Precision::Bf16);
    s.method = Method::Lora;
    s.lora_targets = vec![LoraTarget::Q, LoraTarget::V];
    s.attention = Attention::Sdpa;
    s.stack = stack;
    s
}

fn component(a: &Arch, s: &Setup, name: &str) -> u64 {
    let e = memory::estimate(a, s, &Framework::default()).unwrap();
    e.gpu
        .unwrap()
        .components
        .iter()
        .find(|c| c.name == name)
        .map_or(0, |c| c.bytes)
}

/// LitGPT's model: q, k, v fused into one linear of the same elements, the head untied from the
/// embedding (one vocab × hidden matrix more).
#[test]
fn litgpt_view_fuses_qkv_and_unties_the_head() {
    let a = llama(true);
    let lit = model_view(&a, &Stack::Litgpt.profile());
    assert_eq!(lit.head, Head::LmUntied { bias: false });
    assert_eq!(lit.params_total(), a.params_total() + VOCAB * H);
    let qkv: Vec<_> = lit.tensors.iter().filter(|t| t.role == Role::Qkv).collect();
    assert_eq!(qkv.len(), 1);
    assert_eq!((qkv[0].rows, qkv[0].cols, qkv[0].count), (H, 3 * H, LAYERS));
    assert!(!lit.tensors.iter().any(|t| t.role == Role::Q));
    // other stacks see transformers' model as it is
    assert_eq!(*model_view(&a, &Stack::Torchtune.profile()), a);
}

/// The loss of each stack, per logits element of a bf16 causal LM: transformers 2 + 4 + 4 B kept,
/// LitGPT 2 + 2 B (16-bit chunks and their log-softmax), torchtune 4 B (fp32 chunks, logits
/// deleted).
#[test]
fn each_stack_keeps_its_loss() {
    let a = llama(false);
    let lv = 2 * 128 * VOCAB;
    let logits = |stack| component(&a, &lora(&a, stack), "logits + loss");
    assert_eq!(logits(Stack::HfTrainer), lv * 10);
    assert_eq!(logits(Stack::Torchtune), lv * 4);
    // LitGPT's untied head changes nothing here: same vocab, same tokens
    assert_eq!(logits(Stack::Litgpt), lv * 4);
    let mut plain = lora(&a, Stack::Torchtune);
    plain.chunked_loss = Some(false);
    let e = memory::estimate(&a, &plain, &Framework::default()).unwrap();
    let c = e.gpu.unwrap().components;
    assert_eq!(
        c.iter().find(|c| c.name == "logits + loss").unwrap().bytes,
        lv * 8
    );
    assert_eq!(Stack::Torchtune.profile().loss_for(&plain), Loss::Plain);
}

/// FSDP on 2 GPUs with accumulation: LitGPT keeps every block's whole gradient unsharded (no_sync
/// + use_orig_params units), Lightning shards it, the Trainer keeps only the adapters'.
#[test]
fn fsdp_gradients_follow_the_stack() {
    let a = llama(false);
    let fsdp = |stack| {
        let mut s = lora(&a, stack);
        (s.zero, s.gpus, s.accum) = (Zero::FsdpFull, 2, 8);
        component(&a, &s, "gradients")
    };
    let blocks: u64 = a
        .tensors
        .iter()
        .filter(|t| t.group == arch::Group::Decoder)
        .map(|t| t.elements())
        .sum();
    let adapters = memory::states::trainable(&a, &lora(&a, Stack::HfTrainer)).adapters;
    assert_eq!(fsdp(Stack::Litgpt), 2 * (blocks + adapters));
    assert_eq!(fsdp(Stack::Lightning), 2 * (blocks + adapters).div_ceil(2));
    assert_eq!(fsdp(Stack::HfTrainer), 2 * adapters);
    // one micro-batch: nothing accumulates, so LitGPT's gradient is reduced to its shard
    let mut one = lora(&a, Stack::Litgpt);
    (one.zero, one.gpus) = (Zero::FsdpFull, 2);
    assert_eq!(
        component(&a, &one, "gradients"),
        2 * (blocks + adapters).div_ceil(2)
    );
}

/// FSDP's backward prefetch fetches the unit before the computed one in forward order: with the
/// adapters as units of their own (torchtune, PEFT) that is an adapter, so one block is allocated
/// gathered where mixed units (Lightning) hold two; the gather stream's pool keeps the second
/// block's segment reserved either way.
#[test]
fn fsdp_gathers_one_block_when_adapters_are_units_of_their_own() {
    // blocks of 25 MB, well above the allocator's 2 MiB rounding
    let v = json!({"model_type": "llama", "hidden_size": 1024, "intermediate_size": 2752,
        "num_attention_heads": 8, "num_key_value_heads": 8, "num_hidden_layers": LAYERS,
        "vocab_size": VOCAB, "tie_word_embeddings": false});
    let a = arch::parse_config("t.json", &v.to_string(), "t").unwrap();
    let block = a.params_in(arch::Group::Decoder) / LAYERS;
    let root = a.params_in(arch::Group::Embeddings) + a.params_in(arch::Group::Head);
    let run = |stack, method, gpus| {
        let mut s = lora(&a, stack);
        (s.method, s.gpus) = (method, gpus);
        if gpus > 1 {
            s.zero = Zero::FsdpFull;
        }
        let gpu = memory::estimate(&a, &s, &Framework::default())
            .unwrap()
            .gpu
            .unwrap();
        let live = component(&a, &s, "zero-3 live parameters");
        (live, gpu.peak_reserved_bytes - gpu.peak_allocated_bytes)
    };
    let (own_units, sharded_slack) = run(Stack::Torchtune, Method::Lora, 2);
    let (_, one_gpu_slack) = run(Stack::Torchtune, Method::Lora, 1);
    assert_eq!(own_units, 2 * (block + root));
    assert_eq!(
        run(Stack::Lightning, Method::Lora, 2).0,
        2 * (2 * block + root)
    );
    assert_eq!(
        run(Stack::Torchtune, Method::Full, 2).0,
        2 * (2 * block + root)
    );
    // the same activations and loss on one GPU: the difference is the pool's second block,
    // within the 2 MiB rounding of reserved segments
    let pool = sharded_slack as i64 - one_gpu_slack as i64;
    assert!(
        (pool - 2 * block as i64).abs() <= 2 << 20,
        "pool {pool}, block {}",
        2 * block
    );
}

/// Validation row `T2`'s step (torchtune's April 2024 distributed LoRA recipe) replayed on the CPU
/// with torch 2.2.2 at Llama-2-7B's width, 3 and 6 blocks: rank 0's peak allocated MiB, measured
/// 2026-11-27 by `scripts/replay_torchtune_fsdp_cpu.py --layers 3|6`. Counting two gathered
/// blocks put the estimate 19% and 14% above them.
#[test]
fn torchtune_fsdp_lora_replay_allocated() {
    for (layers, measured_mib) in [(3u64, 2588.8f64), (6, 3579.5)] {
        let v = json!({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
            "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": layers,
            "vocab_size": VOCAB, "tie_word_embeddings": false});
        let a = arch::parse_config("t.json", &v.to_string(), "t").unwrap();
        let mut s = lora(&a, Stack::Torchtune);
        (s.batch, s.seq, s.accum) = (2, 512, 2);
        (s.zero, s.gpus, s.chunked_loss) = (Zero::FsdpFull, 2, Some(false));
        s.optimizer = Optimizer::AdamW;
        let gpu = memory::estimate(&a, &s, &Framework::TORCH_2_BNB_LT_044)
            .unwrap()
            .gpu
            .unwrap();
        let predicted_mib = gpu.peak_allocated_bytes as f64 / (1u64 << 20) as f64;
        let error = predicted_mib / measured_mib - 1.0;
        assert!(
            error.abs() < 0.06,
            "{layers} blocks: predicted {predicted_mib:.0} MiB, replay {measured_mib} MiB"
        );
    }
}

/// torchtune's full fine-tuning on one GPU steps inside backward: no gradient persists; with
/// accumulation the recipe refuses it, and the gradients are back.
#[test]
fn torchtune_steps_inside_backward() {
    let a = llama(false);
    let mut s = lora(&a, Stack::Torchtune);
    s.method = Method::Full;
    assert_eq!(component(&a, &s, "gradients"), 0);
    s.accum = 2;
    assert_eq!(component(&a, &s, "gradients"), 2 * a.params_total());
    s.accum = 1;
    s.optimizer_in_backward = Some(false);
    assert_eq!(component(&a, &s, "gradients"), 2 * a.params_total());
}

/// QLoRA: PEFT's preparation makes every non-4-bit parameter fp32 (2 B more each than the
/// Trainer's bf16); bitsandbytes before 0.44 saves every 4-bit linear's input, torchao's NF4
/// (torchtune) never.
#[test]
fn qlora_preparation_and_saved_inputs() {
    let a = llama(false);
    let qlora = |stack| {
        let mut s = lora(&a, stack);
        s.method = Method::Qlora;
        s.quant = Some(Quant::Nf4);
        s.optimizer = Optimizer::PagedAdamW32bit;
        s
    };
    let unquantized: u64 = a
        .tensors
        .iter()
        .filter(|t| !t.is_linear() || t.role == Role::LmHead)
        .map(|t| t.elements())
        .sum();
    let w = |stack| component(&a, &qlora(stack), "weights");
    assert_eq!(w(Stack::Peft) - w(Stack::HfTrainer), 2 * unquantized);
    let blocks = |fw: &Framework, stack| {
        let e = memory::estimate(&a, &qlora(stack), fw).unwrap();
        let c = e.gpu.unwrap().components;
        c.iter()
            .find(|c| c.name == "activations (blocks)")
            .unwrap()
            .bytes
    };
    let (old, new) = (Framework::TORCH_2_BNB_LT_044, Framework::TORCH_2);
    assert!(blocks(&old, Stack::HfTrainer) > blocks(&new, Stack::HfTrainer));
    assert_eq!(
        blocks(&old, Stack::Torchtune),
        blocks(&new, Stack::Torchtune)
    );
}

/// A DeepSpeed engine runs no autocast: with amp precision no weight casts are kept, unlike the
/// Trainer's autocast without ZeRO.
#[test]
fn deepspeed_engine_has_no_autocast_copies() {
    let a = llama(false);
    let mut s = lora(&a, Stack::HfTrainer);
    s.precision = Precision::AmpBf16;
    assert!(component(&a, &s, "autocast weight copies") > 0);
    s.stack = Stack::AccelerateDeepspeed;
    assert_eq!(component(&a, &s, "autocast weight copies"), 0);
}

/// torchtune's QLoRA on torchao 0.1 quantizes each weight in one piece at load: peak reserved is
/// at least the resident weights + 68 bytes per element of the largest quantized weight (its bf16
/// source, the scaled blocks, and `(value - nf4)` with its `.abs()` over 16 levels). Later
/// torchao (chunked), other stacks (bitsandbytes quantizes in a kernel) and LoRA keep no such
/// floor.
#[test]
fn torchao_01_quantization_floor_on_reserved() {
    // a small vocabulary, so that the quantized linears dominate the weights
    let v = json!({"model_type": "llama", "hidden_size": H, "intermediate_size": 688,
        "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": LAYERS,
        "vocab_size": 1000, "tie_word_embeddings": false});
    let a = arch::parse_config("t.json", &v.to_string(), "t").unwrap();
    let mut s = lora(&a, Stack::Torchtune);
    s.method = Method::Qlora;
    s.quant = Some(Quant::Nf4);
    // few tokens, so that training's own peak stays below the floor
    (s.batch, s.seq) = (1, 8);
    let largest = a
        .tensors
        .iter()
        .filter(|t| t.is_linear() && t.role != Role::LmHead)
        .map(|t| t.size())
        .max()
        .unwrap();
    let reserved = |s: &Setup, fw: &Framework| {
        memory::estimate(&a, s, fw)
            .unwrap()
            .gpu
            .unwrap()
            .peak_reserved_bytes
    };
    let weights = component(&a, &s, "weights");
    let (old, new) = (Framework::TORCH_2_BNB_LT_044, Framework::TORCH_2);
    assert!(reserved(&s, &old) >= weights + 68 * largest);
    assert!(reserved(&s, &new) < weights + 68 * largest);
    s.stack = Stack::HfTrainer;
    assert!(reserved(&s, &old) < weights + 68 * largest);
}

/// Hidden size of the models whose load-time blocks set the peak.
const WIDE: u64 = 2048;

/// The quantization blocks of a smaller weight built before a larger one stay cached beside the
/// larger one's (a cudaMalloc segment never grows into another): the attention's pair (64 bytes
/// per element) is added when the MLP weights, built after it, are larger — and not when they
/// are smaller, where the MLP's requests fit in the attention's cached blocks.
#[test]
fn torchao_01_keeps_each_larger_size_class_of_blocks() {
    let reserved_over_floor = |intermediate: u64| {
        // wide enough that the load's blocks, not training, set the peak
        let v = json!({"model_type": "llama", "hidden_size": WIDE, "intermediate_size": intermediate,
            "num_attention_heads": 16, "num_key_value_heads": 16, "num_hidden_layers": 2,
            "vocab_size": 1000, "tie_word_embeddings": false});
        let a = arch::parse_config("t.json", &v.to_string(), "t").unwrap();
        let mut s = lora(&a, Stack::Torchtune);
        (s.method, s.quant) = (Method::Qlora, Some(Quant::Nf4));
        (s.batch, s.seq) = (1, 8);
        let fw = Framework::TORCH_2_BNB_LT_044;
        let gpu = memory::estimate(&a, &s, &fw).unwrap().gpu.unwrap();
        let (attention, mlp) = (WIDE * WIDE, WIDE * intermediate);
        let floor = component(&a, &s, "weights") + 68 * attention.max(mlp);
        (gpu.peak_reserved_bytes - floor, attention)
    };
    // MLP weights larger than the attention's: the attention's pair stays (up to 2 MiB rounding)
    let (over, attention) = reserved_over_floor(5504);
    assert!(
        over >= 64 * attention && over < 64 * attention + (2 << 20),
        "{over}"
    );
    // smaller: nothing beyond the floor but the segments' rounding
    let (over, _) = reserved_over_floor(1024);
    assert!(over < 2 << 20, "smaller MLP: {over}");
}

/// torch.optim.SGD (and the Trainer's `sgd`) keeps no momentum buffer by default: its states are
/// nothing, where AdamW's are two moments.
#[test]
fn sgd_keeps_no_optimizer_state() {
    use memfit_plan::memory::{Optimizer, states};
    let a = memfit_plan::arch::preset("qwen2.5-0.5b").unwrap();
    let mut s = memfit_plan::memory::Setup::new(&a);
    let tr = states::trainable(&a, &s);
    s.optimizer = Optimizer::Sgd;
    assert_eq!(states::optimizer_state_bytes(&s, &tr, 4), 0);
    s.optimizer = Optimizer::AdamW;
    assert_eq!(
        states::optimizer_state_bytes(&s, &tr, 4),
        2 * 4 * tr.total()
    );
}

/// PEFT ≥ 0.12 keeps LoRA weights in fp32 on a bf16 base: weights, gradients and AdamW's two
/// moments of the adapters take 4 B where they took 2; LitGPT's adapters follow the base.
#[test]
fn peft_adapters_are_fp32_on_a_bf16_base() {
    use memfit_plan::memory::{Framework, Method, Precision, Setup, Stack, states};
    let a = memfit_plan::arch::preset("qwen2.5-0.5b").unwrap();
    let mut s = Setup::new(&a);
    (s.method, s.precision) = (Method::Lora, Precision::Bf16);
    let adapters = states::trainable(&a, &s).adapters;
    assert!(adapters > 0);
    let total = |s: &Setup, fw: &Framework| {
        let st = states::model_states(&a, s, fw);
        st.gpu_weights + st.gpu_grads + st.gpu_optimizer
    };
    let (now, before) = (Framework::TORCH_2, Framework::TORCH_2_BNB_LT_044);
    assert_eq!(
        total(&s, &now) - total(&s, &before),
        adapters * (2 + 2 + 2 * 2)
    );
    s.stack = Stack::Litgpt;
    assert_eq!(total(&s, &now), total(&s, &before));
}

/// PEFT 0.5–0.6 (`Framework::TORCH_2_0_PEFT_05`) builds LoRA weights in fp32 on a bf16 base: the
/// adapters' weights, gradients and AdamW states are twice the base dtype's bytes — 2 + 2 + 4 B
/// more per adapter parameter — while PEFT 0.7–0.11 (`TORCH_2_BNB_LT_044`) follows the base.
/// Under a DeepSpeed engine the module is cast to 16 bit before training, so neither differs.
#[test]
fn peft_05_adapters_are_fp32_except_under_a_deepspeed_engine() {
    use memfit_plan::memory::states::{model_states, trainable};
    let a = llama(false);
    let s = lora(&a, Stack::HfTrainer);
    let adapters = trainable(&a, &s).adapters;
    assert!(adapters > 0);
    let total = |s: &Setup, fw: &Framework| {
        let st = model_states(&a, s, fw);
        st.gpu_weights + st.gpu_grads + st.gpu_optimizer
    };
    let (peft05, peft07) = (Framework::TORCH_2_0_PEFT_05, Framework::TORCH_2_BNB_LT_044);
    assert_eq!(
        total(&s, &peft05) - total(&s, &peft07),
        adapters * (2 + 2 + 4)
    );
    let mut ds = lora(&a, Stack::AccelerateDeepspeed);
    ds.zero = Zero::Z2;
    assert_eq!(total(&ds, &peft05), total(&ds, &peft07));
}

/// Under the HF Trainer the outputs are gone before backward, so a checkpointed block is
/// recomputed only after the loss's tensors are freed: allocated counts the larger of the two,
/// reserved both (the forward's block segments stay cached beside the logits). A loop that keeps
/// its outputs (`outputs_kept`, Answer.AI's) holds both at once: allocated counts both.
#[test]
fn a_recomputed_block_meets_the_loss_only_where_the_loop_keeps_its_outputs() {
    let a = llama(false);
    let mut dropped = lora(&a, Stack::HfTrainer);
    (dropped.grad_ckpt, dropped.seq) = (true, 1024);
    let mut kept = dropped.clone();
    kept.outputs_kept = Some(true);
    let fw = Framework::default();
    let gpu = |s: &Setup| memory::estimate(&a, s, &fw).unwrap().gpu.unwrap();
    let (d, k) = (gpu(&dropped), gpu(&kept));
    let act_d = memory::activations::activations(&a, &dropped, &fw);
    let act_k = memory::activations::activations(&a, &kept, &fw);
    assert!(act_d.recompute > 0 && act_d.logits > act_d.recompute);
    assert_eq!(act_k.total() - act_d.total(), act_d.recompute);
    assert_eq!(
        k.peak_allocated_bytes - d.peak_allocated_bytes,
        act_d.recompute
    );
    assert_eq!(k.peak_reserved_bytes, d.peak_reserved_bytes);
    // without checkpointing nothing is recomputed, and the two agree
    let (mut plain_d, mut plain_k) = (dropped.clone(), kept.clone());
    (plain_d.grad_ckpt, plain_k.grad_ckpt) = (false, false);
    assert_eq!(
        gpu(&plain_d).peak_allocated_bytes,
        gpu(&plain_k).peak_allocated_bytes
    );
}
