#!/usr/bin/env python3
"""Builds the BERT-family parity fixtures: tiny random BertForSequenceClassification and
RobertaForSequenceClassification models (fixed seeds), saved with transformers' save_pretrained, and
their eval-mode logits and loss for fixed inputs (padding, sentence pairs) in expected.json.

    python3 scripts/bert_reference.py crates/memfit-nn/tests/fixtures

writes FIXTURES/bert-tiny/ and FIXTURES/roberta-tiny/ (config.json, model.safetensors, expected.json);
the Rust test crates/memfit-nn/tests/bert_parity.rs loads each and compares memfit's logits.

    python3 scripts/bert_reference.py --check DIR --expected FIXTURES/bert-tiny/expected.json

loads a directory memfit saved with transformers, fails on any missing or unexpected key, and compares
its logits with expected.json's (max abs diff <= --tol).

    python3 scripts/bert_reference.py --check-run RUN/best --input valid.jsonl --predictions preds.jsonl

loads a classifier memfit trained (its checkpoint, tokenizer included) with AutoModelForSequenceClassification
and AutoTokenizer, encodes the `text` (and `text_pair`) of each input row, and compares transformers'
log-probabilities with those of `memfit predict --model RUN/best --input valid.jsonl --out preds.jsonl`
(max abs diff <= --tol; log-softmax differs from the logits by a per-row constant only) and the labels.
Needs: pip install torch transformers safetensors (not part of CI). The committed fixtures were made
with the versions expected.json records.
"""

import argparse
import json
import os
import sys

import torch
import transformers
from transformers import (AutoModelForSequenceClassification, BertConfig, BertForSequenceClassification,
                          RobertaConfig, RobertaForSequenceClassification)

SHAPE = dict(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32,
             max_position_embeddings=24, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)

# [CLS]=2 [SEP]=3 pad=0 for BERT; <s>=0 </s>=2 pad=1 for RoBERTa. Row 0 is full, rows 1-2 padded;
# rows 0 and 2 are sentence pairs.
BERT_INPUTS = dict(
    input_ids=[[2, 5, 9, 3, 11, 12, 3], [2, 7, 8, 3, 0, 0, 0], [2, 30, 3, 21, 22, 3, 0]],
    attention_mask=[[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 0]],
    token_type_ids=[[0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1, 0]],
    labels=[2, 0, 1],
)
ROBERTA_INPUTS = dict(
    input_ids=[[0, 5, 9, 2, 2, 11, 2], [0, 7, 8, 2, 1, 1, 1], [0, 30, 2, 2, 21, 2, 1]],
    attention_mask=[[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 0]],
    token_type_ids=[[0] * 7] * 3,
    labels=[1, 0, 1],
)


def randomise(model, seed):
    """Every parameter drawn away from transformers' init (biases 0, LayerNorm 1), so that each one
    shows in the logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1.0 + 0.1 * noise if name.endswith("LayerNorm.weight") else 0.2 * noise)


def run(model, inputs):
    t = {k: torch.tensor(v) for k, v in inputs.items()}
    with torch.no_grad():
        out = model(**t)
    return out.logits.tolist(), out.loss.item()


def build(out_dir, name, model, inputs):
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    model.eval()
    logits, loss = run(model, inputs)
    model.save_pretrained(d, safe_serialization=True)
    expected = dict(inputs, logits=logits, loss=loss, torch=torch.__version__,
                    transformers=transformers.__version__)
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    print(f"{d}: logits {logits[0][:2]}…, loss {loss:.6f}")


def make(out_dir):
    torch.manual_seed(0)
    bert = BertForSequenceClassification(BertConfig(
        **SHAPE, type_vocab_size=2, pad_token_id=0,
        id2label={0: "neg", 1: "neutral", 2: "pos"}, label2id={"neg": 0, "neutral": 1, "pos": 2}))
    randomise(bert, 1)
    build(out_dir, "bert-tiny", bert, BERT_INPUTS)
    torch.manual_seed(0)
    roberta = RobertaForSequenceClassification(RobertaConfig(**SHAPE, type_vocab_size=1, pad_token_id=1))
    randomise(roberta, 2)
    build(out_dir, "roberta-tiny", roberta, ROBERTA_INPUTS)


def check(model_dir, expected_path, tol):
    model, info = AutoModelForSequenceClassification.from_pretrained(
        model_dir, output_loading_info=True, attn_implementation="eager")
    model.eval()
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    with open(expected_path) as f:
        expected = json.load(f)
    inputs = {k: expected[k] for k in ("input_ids", "attention_mask", "token_type_ids", "labels")}
    logits, loss = run(model, inputs)
    diff = (torch.tensor(logits) - torch.tensor(expected["logits"])).abs().max().item()
    print(f"{model_dir}: {type(model).__name__}, loading info {bad or 'clean'}, "
          f"max abs logit diff {diff:.3e}, loss {loss:.6f} vs {expected['loss']:.6f}")
    if bad or diff > tol:
        sys.exit(1)


def check_run(model_dir, input_path, predictions_path, tol):
    model, info = AutoModelForSequenceClassification.from_pretrained(
        model_dir, output_loading_info=True, attn_implementation="eager")
    model.eval()
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    with open(input_path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    with open(predictions_path) as f:
        preds = [json.loads(line) for line in f if line.strip()]
    assert len(rows) == len(preds), f"{len(rows)} rows, {len(preds)} predictions"
    worst, same_label = 0.0, 0
    with torch.no_grad():
        for row, pred in zip(rows, preds):
            enc = tok(row["text"], row.get("text_pair"), return_tensors="pt")
            logp = torch.log_softmax(model(**enc).logits[0].double(), -1)
            theirs = torch.log(torch.tensor(pred["scores"], dtype=torch.float64))
            worst = max(worst, (logp - theirs).abs().max().item())
            label = model.config.id2label[int(logp.argmax())]
            same_label += label == pred["label"]
    print(f"{model_dir}: {type(model).__name__}, loading info {bad or 'clean'}, {len(rows)} rows, "
          f"max abs log-probability diff {worst:.3e}, same label {same_label}/{len(rows)}, "
          f"transformers {transformers.__version__}, torch {torch.__version__}")
    if bad or worst > tol or same_label != len(rows):
        sys.exit(1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", nargs="?")
    p.add_argument("--check")
    p.add_argument("--expected")
    p.add_argument("--tol", type=float, default=1e-4)
    p.add_argument("--check-run")
    p.add_argument("--input")
    p.add_argument("--predictions")
    args = p.parse_args()
    if args.check_run:
        check_run(args.check_run, args.input, args.predictions, args.tol)
    elif args.check:
        check(args.check, args.expected, args.tol)
    elif args.out_dir:
        make(args.out_dir)
    else:
        p.error("give OUT_DIR, or --check DIR --expected FILE")


if __name__ == "__main__":
    main()
