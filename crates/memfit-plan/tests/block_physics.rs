//! The block wiring of issue 17's model types changes what autograd saves, by amounts the rules
//! in memory/activations.rs fix exactly: each test builds two configs that differ in one thing
//! and checks the difference in activation bytes.

use memfit_plan::arch::{self, Arch};
use memfit_plan::memory::activations::{ActivationBytes, activations};
use memfit_plan::memory::{Framework, Precision, Setup};
use serde_json::{Value, json};

const B: u64 = 2;
const SEQ: u64 = 64;
const T: u64 = B * SEQ;

fn arch(v: Value) -> Arch {
    arch::parse_config("test.json", &v.to_string(), "test").unwrap()
}

fn act(a: &Arch, precision: Precision, fw: &Framework) -> ActivationBytes {
    let mut s = Setup::new(a);
    (s.batch, s.seq, s.precision) = (B, SEQ, precision);
    activations(a, &s, fw)
}

/// A decoder of hidden 256 with 8 query heads in 2 key/value groups (chatglm's fields too).
fn grouped(model_type: &str, layers: u64) -> Arch {
    arch(
        json!({"model_type": model_type, "hidden_size": 256, "intermediate_size": 512,
        "num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": layers,
        "vocab_size": 1000, "tie_word_embeddings": false, "multi_query_attention": true,
        "multi_query_group_num": 2, "kv_channels": 32, "ffn_hidden_size": 512,
        "num_layers": layers, "padded_vocab_size": 1000, "seq_length": 64}),
    )
}

fn fp32(a: &Arch) -> ActivationBytes {
    act(a, Precision::Fp32, &Framework::default())
}

/// gpt-neox with `use_parallel_residual`: the MLP's LayerNorm reads the block input the
/// attention's LayerNorm keeps, so there is no residual `x + attn` to save: one hidden-size
/// tensor per block less, only the second norm's mean/rstd remain.
#[test]
fn parallel_block_saves_no_intermediate_residual() {
    let neox = |parallel: bool| {
        arch(
            json!({"model_type": "gpt_neox", "hidden_size": 256, "intermediate_size": 1024,
            "num_attention_heads": 4, "num_hidden_layers": 3, "vocab_size": 1000,
            "use_parallel_residual": parallel}),
        )
    };
    let (seq, par) = (fp32(&neox(false)), fp32(&neox(true)));
    assert_eq!(seq.blocks - par.blocks, 3 * T * 256 * 4);
}

/// phi3's fused qkv_proj: v is a slice of the projection's output, so it keeps the projected q
/// and k alive beside their rotated copies; llama's separate projections do not.
#[test]
fn fused_qkv_with_rotary_keeps_the_projection() {
    let (phi3, llama) = (grouped("phi3", 2), grouped("llama", 2));
    assert_eq!(phi3.params_total(), llama.params_total());
    let (inner, kv) = (256, 2 * 32);
    assert_eq!(
        fp32(&phi3).blocks - fp32(&llama).blocks,
        2 * T * (inner + kv) * 4
    );
}

/// gemma2 without softcapping differs from gemma by its post-attention and post-MLP RMS norms,
/// each saving its fp32 input and the normalized tensor.
#[test]
fn gemma2_sandwich_norms() {
    let cfg = |model_type: &str| {
        arch(
            json!({"model_type": model_type, "hidden_size": 256, "intermediate_size": 512,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
            "num_hidden_layers": 3, "vocab_size": 1000, "attn_logit_softcapping": null,
            "final_logit_softcapping": null}),
        )
    };
    let (g2, g1) = (fp32(&cfg("gemma2")), fp32(&cfg("gemma")));
    assert_eq!(g2.blocks - g1.blocks, 3 * 2 * T * 256 * (4 + 4));
    assert_eq!(g2.logits, g1.logits);
    // softcapping saves tanh's output: of every score matrix, and of the logits
    let capped = fp32(&arch(json!({"model_type": "gemma2", "hidden_size": 256,
        "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 64, "num_hidden_layers": 3, "vocab_size": 1000})));
    assert_eq!(capped.blocks - g2.blocks, 3 * B * 4 * SEQ * SEQ * 4);
    assert_eq!(capped.logits - g2.logits, T * 1000 * 4);
}

fn mixtral(experts: u64, top_k: u64) -> Arch {
    arch(
        json!({"model_type": "mixtral", "hidden_size": 128, "intermediate_size": 512,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
        "vocab_size": 1000, "num_local_experts": experts, "num_experts_per_tok": top_k}),
    )
}

/// Routed activations grow with the experts each token visits, not with the experts there are:
/// more experts only widen the router's probabilities (fp32, one per token and expert).
#[test]
fn moe_activations_follow_top_k() {
    let one = fp32(&mixtral(8, 1)).blocks;
    let two = fp32(&mixtral(8, 2)).blocks;
    let three = fp32(&mixtral(8, 3)).blocks;
    assert!(two > one);
    assert_eq!(three - two, two - one, "linear in top_k");
    // per routed row: gathered input h, SiLU input + both gate factors + down input 4·f, the
    // expert output h (all fp32), and its top-k index (8 B) and weight (4 B)
    assert_eq!(two - one, 2 * T * ((128 + 4 * 512 + 128) * 4 + 12));
    let wide = fp32(&mixtral(16, 2)).blocks;
    assert_eq!(wide - two, 2 * T * 8 * 4);
    let params = |a: Arch| a.params_total();
    assert!(params(mixtral(16, 2)) > params(mixtral(8, 2)));
}

/// Today's causal-LM loss upcasts bf16 logits to fp32 and keeps the fp32 log-softmax; the 2022
/// code shifted a bf16 copy and stayed in bf16.
#[test]
fn causal_loss_upcasts_the_logits() {
    let a = arch(
        json!({"model_type": "qwen3", "hidden_size": 128, "intermediate_size": 256,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "num_hidden_layers": 2, "vocab_size": 5000, "tie_word_embeddings": true}),
    );
    let now = act(&a, Precision::Bf16, &Framework::TORCH_2).logits;
    let old = act(&a, Precision::Bf16, &Framework::torch_1x(0)).logits;
    let lv = T * 5000;
    assert_eq!(now, lv * (2 + 4 + 4));
    assert_eq!(old, lv * (2 + 2 + 2));
}

/// A token computes with top_k experts: more experts of the same size add parameters, not FLOPs.
#[test]
fn moe_flops_count_the_active_experts() {
    use memfit_plan::search::throughput::flops_per_token;
    let flops = |a: &Arch| flops_per_token(a, &Setup::new(a));
    let (eight, sixteen) = (mixtral(8, 2), mixtral(16, 2));
    assert!(sixteen.params_total() > eight.params_total());
    assert_eq!(flops(&eight), flops(&sixteen));
    assert!(flops(&mixtral(8, 4)) > flops(&eight));
}

/// `--lora-targets q,v` on a fused-qkv model adapts the fused projection, once per block.
#[test]
fn lora_q_v_adapts_a_fused_qkv_projection() {
    use memfit_plan::memory::{Method, states};
    let a = arch(
        json!({"model_type": "gpt_neox", "hidden_size": 256, "intermediate_size": 1024,
        "num_attention_heads": 4, "num_hidden_layers": 3, "vocab_size": 1000}),
    );
    let mut s = Setup::new(&a);
    s.method = Method::Lora;
    let r = s.lora_r;
    assert_eq!(states::trainable(&a, &s).adapters, 3 * r * (256 + 3 * 256));
    // the adapters build a graph: the blocks save activations
    assert!(activations(&a, &s, &Framework::default()).blocks > 0);
}

/// With `output_router_logits` the model keeps every sparse block's router logits and the
/// load-balancing loss saves its softmax over them.
#[test]
fn router_logits_for_the_aux_loss() {
    let cfg = |aux: bool| {
        arch(
            json!({"model_type": "mixtral", "hidden_size": 128, "intermediate_size": 512,
            "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
            "vocab_size": 1000, "num_local_experts": 8, "output_router_logits": aux}),
        )
    };
    let (with, without) = (fp32(&cfg(true)), fp32(&cfg(false)));
    assert_eq!(with.blocks - without.blocks, 2 * 2 * T * 8 * 4);
}

/// The logits and their fp32 copy are saved by nothing: the loss backward runs beside the fp32
/// log-softmax alone, so its two fp32 gradients add 8 B per element only beyond the 6 B the
/// forward freed (bf16 logits + fp32 copy), and the freed 16-bit block stays reserved.
#[test]
fn loss_backward_runs_after_the_forward_only_logits_are_freed() {
    let a = arch(
        json!({"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
        "vocab_size": 50000, "tie_word_embeddings": true}),
    );
    let x = act(&a, Precision::Bf16, &Framework::TORCH_2);
    let lv = T * 50000;
    assert_eq!(x.logits, lv * (2 + 4 + 4));
    assert_eq!(x.transient, lv * (4 + 4) - lv * (2 + 4));
    assert_eq!(x.stranded_logits, lv * 2);
}

fn with_setup(a: &Arch, precision: Precision, edit: impl Fn(&mut Setup)) -> ActivationBytes {
    let mut s = Setup::new(a);
    (s.batch, s.seq, s.precision) = (B, SEQ, precision);
    edit(&mut s);
    activations(a, &s, &Framework::TORCH_2)
}

/// Grouped-query attention in fp32 under SDPA: transformers passes k and v unrepeated, SDPA
/// falls back to its math kernel, which saves the fp32 probabilities of every head; bf16 runs
/// flash attention and saves none, and so does fp32 multi-head attention.
#[test]
fn fp32_grouped_query_sdpa_saves_the_probabilities() {
    let cfg = |kv: u64| {
        arch(
            json!({"model_type": "llama", "hidden_size": 128, "intermediate_size": 256,
            "num_attention_heads": 4, "num_key_value_heads": kv, "num_hidden_layers": 2,
            "vocab_size": 1000}),
        )
    };
    let sdpa =
        |a: &Arch, p| with_setup(a, p, |s| s.attention = memfit_plan::memory::Attention::Sdpa);
    assert_eq!(
        sdpa(&cfg(2), Precision::Fp32).attention_matrices,
        2 * B * 4 * SEQ * SEQ * 4
    );
    assert_eq!(sdpa(&cfg(2), Precision::Bf16).attention_matrices, 0);
    assert_eq!(sdpa(&cfg(4), Precision::Fp32).attention_matrices, 0);
}

/// PEFT's adapters are fp32 on a bf16 base: each adapted linear's dropout output is an fp32 copy
/// of its input (4 B + the 1-byte mask), not a bf16 one as before PEFT 0.12.
#[test]
fn peft_adapters_on_a_bf16_base_save_fp32_inputs() {
    use memfit_plan::memory::{LoraTarget, Method, Stack};
    let a = arch(
        json!({"model_type": "llama", "hidden_size": 128, "intermediate_size": 256,
        "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 1,
        "vocab_size": 1000}),
    );
    let lora = |stack: Stack| {
        with_setup(&a, Precision::Bf16, |s| {
            s.method = Method::Lora;
            s.lora_targets = vec![LoraTarget::Q, LoraTarget::V];
            s.stack = stack;
        })
    };
    let plain_bf16 = lora(Stack::HfTrainer).blocks;
    let mut older = Setup::new(&a);
    (older.batch, older.seq, older.precision) = (B, SEQ, Precision::Bf16);
    older.method = Method::Lora;
    older.lora_targets = vec![LoraTarget::Q, LoraTarget::V];
    let before_peft_012 = activations(&a, &older, &Framework::TORCH_2_BNB_LT_044).blocks;
    // two adapters reading the 128-wide normed input: 4 − 2 more bytes each per token
    assert_eq!(plain_bf16 - before_peft_012, 2 * T * 128 * 2);
}

/// A fused attention kernel that takes grouped-query keys and values as they are saves them at
/// their own width: transformers' SDPA where it passes `enable_gqa` (PyTorch 2 today,
/// `Framework::sdpa_gqa_unrepeated`) and its flash attention. Older transformers, eager code
/// and the remote-code models repeat them to every head first.
#[test]
fn fused_attention_keeps_grouped_keys_and_values_unrepeated() {
    use memfit_plan::memory::Attention;
    let blocks = |a: &Arch, attention: Attention, fw: &Framework| {
        let mut s = Setup::new(a);
        (s.batch, s.seq, s.precision, s.attention) = (B, SEQ, Precision::Bf16, attention);
        activations(a, &s, fw).blocks
    };
    let llama = grouped("llama", 3);
    let (new, old) = (Framework::TORCH_2, Framework::TORCH_2_BNB_LT_044);
    let repeated = 3 * 2 * T * (256 - 2 * 32) * 2;
    assert_eq!(
        blocks(&llama, Attention::Sdpa, &old) - blocks(&llama, Attention::Sdpa, &new),
        repeated
    );
    assert_eq!(
        blocks(&llama, Attention::Flash, &old),
        blocks(&llama, Attention::Sdpa, &new)
    );
    let glm = grouped("chatglm", 3);
    assert_eq!(
        blocks(&glm, Attention::Sdpa, &old),
        blocks(&glm, Attention::Sdpa, &new)
    );
}
