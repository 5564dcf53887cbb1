#!/usr/bin/env python3
"""The meta device's peak allocated bytes (`measure_gpu_memory.py --device meta`, a line per row)
beside a card's or memfit's estimate, row by row, as a markdown table.

    card      the card's measurement of the same rows of validation/measured_here.csv (their runs in
              measured_here_runs.jsonl; the largest where a row ran twice)
    estimate  `memfit estimate`'s peak allocated for the rows of --rows (default
              validation/measured_here.csv), run with the binary of --memfit

    python3 scripts/measure_gpu_memory.py --rows validation/measured_here.csv --only H6,H7 \\
        --device meta > meta.jsonl
    python3 scripts/meta_compare.py card meta.jsonl
    python3 scripts/measure_gpu_memory.py --rows scripts/meta_grid.csv --device meta > grid.jsonl
    python3 scripts/meta_compare.py estimate grid.jsonl --rows scripts/meta_grid.csv
"""

import argparse
import csv
import json
import os
import subprocess
import sys

GIB = 1 << 30
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VALIDATION = os.path.join(ROOT, "validation")


def card_peaks():
    """{row id: the card's peak allocated bytes}."""
    peaks = {}
    with open(os.path.join(VALIDATION, "measured_here_runs.jsonl")) as f:
        for line in f:
            run = json.loads(line)
            if "alloc" in run:
                peaks[run["id"]] = max(peaks.get(run["id"], 0), run["alloc"])
    return peaks


def estimate(memfit, row):
    """`memfit estimate`'s peak allocated bytes for a row (causal-lm, one GPU), or None."""
    model = row["model"] if os.path.sep in row["model"] else os.path.join(VALIDATION, "models", row["model"])
    args = [memfit, "estimate", "--model", model, "--batch", row["batch"], "--seq", row["seq"],
            "--precision", row["precision"], "--optimizer", row["optimizer"], "--method", row["method"],
            "--attention", row["attention"] or "sdpa", "--stack", row["stack"] or "hf-trainer", "--json"]
    if row["method"] == "lora":
        args += ["--lora-r", row["lora_r"], "--lora-alpha", row["lora_alpha"], "--lora-targets", row["lora_targets"]]
    if row["grad_ckpt"] == "true":
        args.append("--grad-ckpt")
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"{row['id']}: {done.stderr.strip()[:300]}", file=sys.stderr)
        return None
    return json.loads(done.stdout)["gpu"]["peak_allocated_bytes"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("against", choices=["card", "estimate"])
    p.add_argument("meta", help="measure_gpu_memory.py --device meta's output")
    p.add_argument("--rows", default=os.path.join(VALIDATION, "measured_here.csv"))
    p.add_argument("--memfit", default=os.path.join(ROOT, "target", "release", "memfit"))
    args = p.parse_args()
    with open(args.rows, newline="") as f:
        rows = {r["id"]: r for r in csv.DictReader(f)}
    cards = card_peaks() if args.against == "card" else {}
    other = "card" if args.against == "card" else "estimate"
    print(f"| row | model | method | precision | batch × seq | checkpointing | attention | meta GiB | {other} GiB | {other} / meta − 1 |")
    print("| --- | --- | --- | --- | --- | --- | --- | ---: | ---: | ---: |")
    with open(args.meta) as f:
        for line in f:
            meta = json.loads(line)
            row = rows.get(meta["id"])
            if row is None or "alloc" not in meta:
                continue
            value = cards.get(meta["id"]) if args.against == "card" else estimate(args.memfit, row)
            if not value:
                continue
            print(f"| {meta['id']} | {row['model'].removesuffix('.json')} | {row['method']} | {row['precision']} "
                  f"| {row['batch']} × {row['seq']} | {row['grad_ckpt']} | {row['attention']} "
                  f"| {meta['alloc'] / GIB:.2f} | {value / GIB:.2f} | {100 * (value / meta['alloc'] - 1):+.1f}% |")


if __name__ == "__main__":
    main()
