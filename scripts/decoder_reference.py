#!/usr/bin/env python3
"""Builds the decoder parity fixtures: tiny random LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM
and Qwen3ForCausalLM models (fixed seeds, every weight drawn away from its init), saved with transformers'
save_pretrained, with their eval-mode logits for fixed inputs (a full row, a right-padded and a left-padded
one), the RoPE tables and the first layer's output, in expected.json; and a PEFT LoRA adapter (B non-zero)
on the llama model with the adapted model's logits.

    python3 scripts/decoder_reference.py crates/memfit-nn/tests/fixtures

writes FIXTURES/{llama,qwen2,mistral,qwen3}-tiny/ (config.json, model.safetensors, expected.json) and
FIXTURES/llama-tiny-lora/ (adapter_config.json, adapter_model.safetensors, expected.json); the Rust test
crates/memfit-nn/tests/decoder/parity.rs compares memfit's values with them.

What the configs exercise: llama — grouped KV heads (2:1), llama3 RoPE scaling, attention and MLP biases;
qwen2 — q/k/v biases, tied embeddings, 4:1 KV groups, dynamic NTK RoPE past max_position_embeddings;
mistral — a sliding window shorter than the sequence, linear RoPE scaling; qwen3 — per-head q/k norms,
an explicit head_dim, attention biases, tied embeddings.

    python3 scripts/decoder_reference.py --check DIR --expected FIXTURE/expected.json
    python3 scripts/decoder_reference.py --check ADAPTER_DIR --base BASE_DIR --expected FIXTURE/expected.json

loads a model directory memfit saved with AutoModelForCausalLM (or an adapter memfit saved with
PeftModel.from_pretrained onto BASE_DIR), fails on any missing or unexpected key, and compares its logits on
the real tokens with expected.json's (max abs diff <= --tol).
    python3 scripts/decoder_reference.py --check-run RUN/best --input valid.jsonl --predictions preds.jsonl

loads a model memfit trained (a full model, or a LoRA adapter with PeftModel.from_pretrained onto the base its
adapter_config.json names), fails on any missing or unexpected key, renders each input row's prompt with the
checkpoint tokenizer's chat template (add_generation_prompt=True), generates greedily as many tokens as memfit
did, and compares the text with `memfit predict --model RUN/best --input valid.jsonl --out preds.jsonl`'s.
Needs: pip install torch transformers peft safetensors (not part of CI). The committed fixtures were made
with the versions expected.json records.
"""

import argparse
import json
import os
import sys

import peft
import torch
import transformers
from transformers import (AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config)

SHAPE = dict(vocab_size=40, hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
             initializer_range=0.02, rms_norm_eps=1e-6, pad_token_id=0)

CONFIGS = {
    "llama-tiny": lambda: LlamaConfig(
        **SHAPE, num_key_value_heads=2, max_position_embeddings=64, attention_bias=True, mlp_bias=True,
        rope_parameters=dict(rope_type="llama3", rope_theta=500.0, factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=16)),
    "qwen2-tiny": lambda: Qwen2Config(
        **SHAPE, num_key_value_heads=1, max_position_embeddings=8, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="dynamic", rope_theta=1000.0, factor=2.0)),
    "mistral-tiny": lambda: MistralConfig(
        **SHAPE, num_key_value_heads=2, max_position_embeddings=64, sliding_window=4,
        rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0)),
    "qwen3-tiny": lambda: Qwen3Config(
        **SHAPE, num_key_value_heads=2, head_dim=16, max_position_embeddings=64, attention_bias=True,
        tie_word_embeddings=True),
}

# Row 0 is full, row 1 right-padded (6 tokens), row 2 left-padded (7 tokens); pad id 0.
INPUT_IDS = [[5, 9, 11, 12, 30, 7, 8, 21, 22, 3],
             [7, 8, 3, 38, 39, 4, 0, 0, 0, 0],
             [0, 0, 0, 17, 2, 33, 34, 9, 10, 11]]
ATTENTION_MASK = [[1 if (r != 1 or t < 6) and (r != 2 or t >= 3) else 0 for t in range(10)] for r in range(3)]


def position_ids(mask):
    """As transformers' generate derives them: the count of real tokens before, padding at 1."""
    m = torch.tensor(mask)
    return (m.cumsum(-1) - 1).masked_fill(m == 0, 1)


def randomise(model, seed):
    """Every parameter drawn away from transformers' init (biases 0, norms 1, B 0), so that each shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1.0 + 0.1 * noise if name.endswith("norm.weight") else 0.2 * noise)


def forward(model):
    inputs = dict(input_ids=torch.tensor(INPUT_IDS), attention_mask=torch.tensor(ATTENTION_MASK),
                  position_ids=position_ids(ATTENTION_MASK))
    with torch.no_grad():
        return model(**inputs, output_hidden_states=True)


def rope_tables(model):
    """cos and sin of the rotary embedding for the fixture's positions, [3, 10, head_dim] each."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    x = torch.zeros(1, dtype=torch.float32)
    with torch.no_grad():
        cos, sin = base.model.rotary_emb(x, position_ids(ATTENTION_MASK))
    return cos.tolist(), sin.tolist()


def expected(model):
    out = forward(model)
    cos, sin = rope_tables(model)
    return dict(input_ids=INPUT_IDS, attention_mask=ATTENTION_MASK,
                position_ids=position_ids(ATTENTION_MASK).tolist(), logits=out.logits.tolist(),
                layer0=out.hidden_states[1].tolist(), rope_cos=cos, rope_sin=sin,
                torch=torch.__version__, transformers=transformers.__version__, peft=peft.__version__)


def rounded(v):
    """Floats to 8 significant digits (f32 holds about 7.2): half the file, no loss that a 1e-4 bar sees."""
    if isinstance(v, float):
        return float(f"{v:.8g}")
    if isinstance(v, list):
        return [rounded(x) for x in v]
    if isinstance(v, dict):
        return {k: rounded(x) for k, x in v.items()}
    return v


def write_expected(d, values):
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(rounded(values), f, separators=(",", ":"))


def drop_extras(d):
    """What save_pretrained writes beside the weights that memfit does not read."""
    for name in ("generation_config.json", "README.md"):
        if os.path.exists(os.path.join(d, name)):
            os.remove(os.path.join(d, name))


def build(out_dir, name, seed):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS[name](), attn_implementation="eager")
    randomise(model, seed)
    model.eval()
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    drop_extras(d)
    values = expected(model)
    write_expected(d, values)
    print(f"{d}: logits[0][0][:3] {values['logits'][0][0][:3]}")
    return model


def build_lora(out_dir, base):
    """A PEFT adapter on every projection of `base`, A and B random (B non-zero), r 4, alpha 8."""
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, task_type="CAUSAL_LM",
                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                             "down_proj"])
    model = peft.get_peft_model(base, config)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    model.eval()
    d = os.path.join(out_dir, "llama-tiny-lora")
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d)
    drop_extras(d)
    write_expected(d, expected(model))
    print(f"{d}: adapter of r 4 on {sorted(config.target_modules)}")


def make(out_dir):
    for seed, name in enumerate(CONFIGS, start=1):
        model = build(out_dir, name, seed)
        if name == "llama-tiny":
            build_lora(out_dir, model)


def real_token_diff(logits, expected_logits):
    mask = torch.tensor(ATTENTION_MASK, dtype=torch.bool)
    return (logits - torch.tensor(expected_logits))[mask].abs().max().item()


def check(model_dir, expected_path, tol, base_dir=None):
    if base_dir:
        base = AutoModelForCausalLM.from_pretrained(base_dir, attn_implementation="eager")
        model = peft.PeftModel.from_pretrained(base, model_dir)
        # load_adapter returns what from_pretrained only warns about: the adapter's missing and
        # unexpected keys (loaded a second time under another name, just to see them).
        result = model.load_adapter(model_dir, adapter_name="check")
        model.set_adapter("default")
        bad = {k: v for k, v in (("missing_keys", result.missing_keys),
                                 ("unexpected_keys", result.unexpected_keys)) if v}
        kind = f"PeftModel ({type(base).__name__} + LoRA)"
    else:
        model, info = AutoModelForCausalLM.from_pretrained(model_dir, output_loading_info=True,
                                                           attn_implementation="eager")
        bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
        kind = type(model).__name__
    model.eval()
    with open(expected_path) as f:
        expected_values = json.load(f)
    diff = real_token_diff(forward(model).logits, expected_values["logits"])
    print(f"{model_dir}: {kind}, loading info {bad or 'clean'}, max abs logit diff {diff:.3e}")
    if bad or diff > tol:
        sys.exit(1)


def check_run(run_dir, input_path, predictions_path):
    tok = transformers.AutoTokenizer.from_pretrained(run_dir)
    adapter = os.path.exists(os.path.join(run_dir, "adapter_config.json"))
    if adapter:
        with open(os.path.join(run_dir, "adapter_config.json")) as f:
            base_dir = json.load(f)["base_model_name_or_path"]
        base = AutoModelForCausalLM.from_pretrained(base_dir, attn_implementation="eager")
        model = peft.PeftModel.from_pretrained(base, run_dir)
        # as check() does: load_adapter returns the missing and unexpected keys from_pretrained hides
        result = model.load_adapter(run_dir, adapter_name="check")
        model.set_adapter("default")
        info = {"missing_keys": result.missing_keys, "unexpected_keys": result.unexpected_keys}
    else:
        model, info = AutoModelForCausalLM.from_pretrained(run_dir, output_loading_info=True,
                                                           attn_implementation="eager")
    model.eval()
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    with open(input_path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    with open(predictions_path) as f:
        preds = [json.loads(line)["text"] for line in f if line.strip()]
    same = 0
    for row, theirs in zip(rows, preds):
        user = row["instruction"] + ("\n" + row["input"] if row.get("input") else "")
        ids = tok.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"]
        n = len(tok(theirs, add_special_tokens=False)["input_ids"]) + 1
        with torch.no_grad():
            out = model.generate(input_ids=ids, max_new_tokens=n, do_sample=False,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        ours = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()
        same += ours == theirs.strip()
    print(f"{run_dir}: {'PeftModel' if adapter else type(model).__name__}, loading info {bad or 'clean'}, "
          f"same greedy text for {same}/{len(rows)} rows, transformers {transformers.__version__}, "
          f"peft {peft.__version__}, torch {torch.__version__}")
    if bad or same != len(rows):
        sys.exit(1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", nargs="?")
    p.add_argument("--check")
    p.add_argument("--base")
    p.add_argument("--expected")
    p.add_argument("--tol", type=float, default=1e-4)
    p.add_argument("--check-run")
    p.add_argument("--input")
    p.add_argument("--predictions")
    args = p.parse_args()
    if args.check_run:
        return check_run(args.check_run, args.input, args.predictions)
    if args.check:
        check(args.check, args.expected, args.tol, args.base)
    elif args.out_dir:
        make(args.out_dir)
    else:
        p.error("give OUT_DIR, or --check DIR [--base BASE_DIR] --expected FILE")


if __name__ == "__main__":
    main()
