#!/usr/bin/env python3
"""Writes the parameter-count reference table that memfit-plan's tests check exactly.

Each row is a published config.json (the fields that decide the shapes, copied from the model's
config on the Hugging Face Hub), instantiated with transformers' own modeling class on the meta
device (no weights are allocated or downloaded), and counted as transformers counts it:
`model.parameters()` lists a tied matrix once. The table is written to
crates/memfit-plan/tests/fixtures/param_reference.json; `tests/param_reference.rs` parses every
config with memfit's reader and asserts the same totals.

Usage (a virtual environment outside the repository; torch and transformers from PyPI):
    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch transformers
    /tmp/venv/bin/python scripts/param_reference.py
"""

import json
import pathlib
import sys

import torch
import transformers

OUT = pathlib.Path(__file__).resolve().parent.parent / (
    "crates/memfit-plan/tests/fixtures/param_reference.json"
)

# (name, class, config.json fields). `architectures` is set to the class, so memfit chooses the
# same head transformers builds.
MODELS = [
    # --- the model types memfit read before issue 17 ---
    ("t5-small", "T5ForConditionalGeneration", {
        "model_type": "t5", "d_model": 512, "d_ff": 2048, "d_kv": 64, "num_heads": 8,
        "num_layers": 6, "vocab_size": 32128, "feed_forward_proj": "relu",
        "tie_word_embeddings": True}),
    # No mt5 row: transformers 5's MT5Config.__post_init__ forces tie_word_embeddings=True ("official
    # weights have False serialized, but we have to tie always"), so it counts mT5's lm_head once,
    # while the published checkpoints carry an untied lm_head (mt5-small: 300M parameters).
    # validation/models/param_counts.csv checks mt0-xxl's published, untied count instead.
    ("bert-base-uncased", "BertModel", {
        "model_type": "bert", "hidden_size": 768, "num_attention_heads": 12,
        "num_hidden_layers": 12, "intermediate_size": 3072, "vocab_size": 30522,
        "max_position_embeddings": 512, "type_vocab_size": 2}),
    ("roberta-base", "RobertaModel", {
        "model_type": "roberta", "hidden_size": 768, "num_attention_heads": 12,
        "num_hidden_layers": 12, "intermediate_size": 3072, "vocab_size": 50265,
        "max_position_embeddings": 514, "type_vocab_size": 1}),
    ("gpt2", "GPT2LMHeadModel", {
        "model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
        "vocab_size": 50257}),
    ("tinyllama-1.1b", "LlamaForCausalLM", {
        "model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632,
        "num_attention_heads": 32, "num_key_value_heads": 4, "num_hidden_layers": 22,
        "vocab_size": 32000, "tie_word_embeddings": False}),
    ("mistral-7b-v0.1", "MistralForCausalLM", {
        "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
        "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
        "vocab_size": 32000, "tie_word_embeddings": False}),
    ("qwen2.5-0.5b", "Qwen2ForCausalLM", {
        "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
        "num_attention_heads": 14, "num_key_value_heads": 2, "num_hidden_layers": 24,
        "vocab_size": 151936, "tie_word_embeddings": True}),
    ("gemma-2b", "GemmaForCausalLM", {
        "model_type": "gemma", "hidden_size": 2048, "intermediate_size": 16384,
        "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256,
        "num_hidden_layers": 18, "vocab_size": 256000}),
    ("phi-2", "PhiForCausalLM", {
        "model_type": "phi", "hidden_size": 2560, "intermediate_size": 10240,
        "num_attention_heads": 32, "num_hidden_layers": 32, "vocab_size": 51200,
        "partial_rotary_factor": 0.4, "tie_word_embeddings": False}),
    ("stablelm-2-1.6b", "StableLmForCausalLM", {
        "model_type": "stablelm", "hidden_size": 2048, "intermediate_size": 5632,
        "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 24,
        "vocab_size": 100352, "use_qkv_bias": True, "tie_word_embeddings": False}),
    ("falcon-7b", "FalconForCausalLM", {
        "model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71,
        "num_hidden_layers": 32, "vocab_size": 65024, "multi_query": True,
        "parallel_attn": True, "bias": False, "new_decoder_architecture": False}),
    ("bloom-560m", "BloomForCausalLM", {
        "model_type": "bloom", "hidden_size": 1024, "n_head": 16, "n_layer": 24,
        "vocab_size": 250880}),
    # --- issue 17: dense decoders ---
    ("pythia-160m", "GPTNeoXForCausalLM", {
        "model_type": "gpt_neox", "hidden_size": 768, "intermediate_size": 3072,
        "num_attention_heads": 12, "num_hidden_layers": 12, "vocab_size": 50304,
        "max_position_embeddings": 2048, "rotary_pct": 0.25, "use_parallel_residual": True,
        "tie_word_embeddings": False, "hidden_act": "gelu"}),
    ("pythia-410m", "GPTNeoXForCausalLM", {
        "model_type": "gpt_neox", "hidden_size": 1024, "intermediate_size": 4096,
        "num_attention_heads": 16, "num_hidden_layers": 24, "vocab_size": 50304,
        "max_position_embeddings": 2048, "rotary_pct": 0.25, "use_parallel_residual": True,
        "tie_word_embeddings": False, "hidden_act": "gelu"}),
    ("gpt-j-6b", "GPTJForCausalLM", {
        "model_type": "gptj", "n_embd": 4096, "n_head": 16, "n_layer": 28, "n_positions": 2048,
        "rotary_dim": 64, "vocab_size": 50400, "activation_function": "gelu_new",
        "tie_word_embeddings": False}),
    ("opt-125m", "OPTForCausalLM", {
        "model_type": "opt", "hidden_size": 768, "ffn_dim": 3072, "num_attention_heads": 12,
        "num_hidden_layers": 12, "vocab_size": 50272, "max_position_embeddings": 2048,
        "word_embed_proj_dim": 768, "do_layer_norm_before": True, "dropout": 0.1,
        "activation_function": "relu"}),
    ("opt-350m", "OPTForCausalLM", {
        "model_type": "opt", "hidden_size": 1024, "ffn_dim": 4096, "num_attention_heads": 16,
        "num_hidden_layers": 24, "vocab_size": 50272, "max_position_embeddings": 2048,
        "word_embed_proj_dim": 512, "do_layer_norm_before": False, "dropout": 0.1,
        "activation_function": "relu"}),
    ("opt-1.3b", "OPTForCausalLM", {
        "model_type": "opt", "hidden_size": 2048, "ffn_dim": 8192, "num_attention_heads": 32,
        "num_hidden_layers": 24, "vocab_size": 50272, "max_position_embeddings": 2048,
        "word_embed_proj_dim": 2048, "do_layer_norm_before": True, "dropout": 0.1,
        "activation_function": "relu"}),
    ("phi-3-mini-4k", "Phi3ForCausalLM", {
        "model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
        "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 32,
        "vocab_size": 32064, "max_position_embeddings": 4096, "hidden_act": "silu",
        "tie_word_embeddings": False}),
    ("gemma-2-2b", "Gemma2ForCausalLM", {
        "model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
        "num_hidden_layers": 26, "vocab_size": 256000, "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": 256, "sliding_window": 4096, "final_logit_softcapping": 30.0,
        "attn_logit_softcapping": 50.0}),
    ("qwen3-0.6b", "Qwen3ForCausalLM", {
        "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "num_hidden_layers": 28, "vocab_size": 151936, "tie_word_embeddings": True}),
    ("qwen3-8b", "Qwen3ForCausalLM", {
        "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "num_hidden_layers": 36, "vocab_size": 151936, "tie_word_embeddings": False}),
    ("starcoder2-3b", "Starcoder2ForCausalLM", {
        "model_type": "starcoder2", "hidden_size": 3072, "intermediate_size": 12288,
        "num_attention_heads": 24, "num_key_value_heads": 2, "num_hidden_layers": 30,
        "vocab_size": 49152, "use_bias": True, "hidden_act": "gelu_pytorch_tanh",
        "bos_token_id": 0, "eos_token_id": 0, "tie_word_embeddings": True}),
    # --- issue 17: mixtures of experts ---
    ("mixtral-8x7b", "MixtralForCausalLM", {
        "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
        "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
        "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2,
        "tie_word_embeddings": False}),
    ("qwen1.5-moe-a2.7b", "Qwen2MoeForCausalLM", {
        "model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632,
        "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
        "num_attention_heads": 16, "num_key_value_heads": 16, "num_hidden_layers": 24,
        "vocab_size": 151936, "num_experts": 60, "num_experts_per_tok": 4,
        "decoder_sparse_step": 1, "tie_word_embeddings": False}),
    ("qwen3-30b-a3b", "Qwen3MoeForCausalLM", {
        "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
        "moe_intermediate_size": 768, "num_attention_heads": 32, "num_key_value_heads": 4,
        "head_dim": 128, "num_hidden_layers": 48, "vocab_size": 151936, "num_experts": 128,
        "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "norm_topk_prob": True, "tie_word_embeddings": False}),
    # Not a published model: qwen2_moe with dense layers among the sparse ones, so that
    # `mlp_only_layers` and `decoder_sparse_step` are both exercised.
    ("qwen2-moe-mixed-layers", "Qwen2MoeForCausalLM", {
        "model_type": "qwen2_moe", "hidden_size": 512, "intermediate_size": 1536,
        "moe_intermediate_size": 256, "shared_expert_intermediate_size": 768,
        "num_attention_heads": 8, "num_key_value_heads": 4, "num_hidden_layers": 8,
        "vocab_size": 32000, "num_experts": 16, "num_experts_per_tok": 2,
        "decoder_sparse_step": 2, "mlp_only_layers": [3], "tie_word_embeddings": False}),
]


def count(cls_name, fields):
    config = transformers.AutoConfig.for_model(**fields)
    cls = getattr(transformers, cls_name)
    with torch.device("meta"):
        model = cls(config)
    params = list(model.parameters())  # a tied matrix is one Parameter, listed once
    total = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    return total, trainable


def main():
    rows = []
    for name, cls_name, fields in MODELS:
        total, trainable = count(cls_name, fields)
        config = {"architectures": [cls_name], **fields}
        rows.append({"name": name, "class": cls_name, "params_total": total,
                     "params_trainable": trainable, "config": config})
        print(f"{name:28} {cls_name:30} {total:>15,}", file=sys.stderr)
    table = {
        "generated_by": "scripts/param_reference.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "rows": rows,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {len(rows)} rows to {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
