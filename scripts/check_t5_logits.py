#!/usr/bin/env python3
"""Loads a memfit T5 checkpoint with transformers and compares its logits with the ones memfit wrote.

    cargo run --release -p memfit-train --example t5_dump_logits -- /tmp/t5-check relu
    python3 scripts/check_t5_logits.py /tmp/t5-check

DIR holds config.json + model.safetensors (a memfit checkpoint) and logits.safetensors (fixed inputs
and memfit's logits and loss). Exits 1 if the max abs logit difference exceeds --tol (1e-4).
Needs: pip install torch transformers safetensors (not part of CI).
"""

import argparse
import sys

import torch
from safetensors.torch import load_file
from transformers import T5ForConditionalGeneration


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir")
    p.add_argument("--tol", type=float, default=1e-4)
    args = p.parse_args()

    model = T5ForConditionalGeneration.from_pretrained(args.dir, attn_implementation="eager").eval()
    ref = load_file(f"{args.dir}/logits.safetensors")
    ids = ref["input_ids"].long()
    mask = ref["attention_mask"].long()
    labels = ref["labels"].long().masked_fill(ref["label_mask"] == 0, -100)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
    diff = (out.logits.float() - ref["logits"]).abs()
    max_diff = diff.max().item()
    loss_diff = abs(out.loss.item() - ref["loss"].item())
    print(f"logits {tuple(out.logits.shape)}: max abs diff {max_diff:.3e}; "
          f"loss transformers {out.loss.item():.6f} memfit {ref['loss'].item():.6f} (diff {loss_diff:.3e})")
    if max_diff > args.tol:
        print(f"FAIL: max abs diff {max_diff:.3e} > {args.tol:.1e}", file=sys.stderr)
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
