#!/usr/bin/env python3
"""The meta device's peak allocated bytes (`measure_gpu_memory.py --device meta`, a line per row)
beside a card's or memfit's estimate, row by row, as a markdown table.

    card      the card's measurement of the same rows of validation/measured_here.csv (their runs in
              measured_here_runs.jsonl; the largest where a row ran twice)
    estimate  memfit's estimate of the rows of --rows (default validation/measured_here.csv),
              read as the validation reads a row (memfit-plan's example `estimate_rows`)

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


def estimates(rows_csv):
    """{row id: memfit's estimated peak allocated bytes}, every row of the CSV at once."""
    done = subprocess.run(["cargo", "run", "-q", "--release", "-p", "memfit-plan", "--example",
                           "estimate_rows", "--", os.path.abspath(rows_csv)],
                          cwd=ROOT, capture_output=True, text=True, check=True)
    lines = (json.loads(line) for line in done.stdout.splitlines())
    return {e["id"]: e["peak_allocated_bytes"] for e in lines}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("against", choices=["card", "estimate"])
    p.add_argument("meta", help="measure_gpu_memory.py --device meta's output")
    p.add_argument("--rows", default=os.path.join(VALIDATION, "measured_here.csv"))
    args = p.parse_args()
    with open(args.rows, newline="") as f:
        rows = {r["id"]: r for r in csv.DictReader(f)}
    others = card_peaks() if args.against == "card" else estimates(args.rows)
    other = "card" if args.against == "card" else "estimate"
    print(f"| row | model | method | precision | batch × seq | checkpointing | attention | meta GiB | {other} GiB | {other} / meta − 1 |")
    print("| --- | --- | --- | --- | --- | --- | --- | ---: | ---: | ---: |")
    with open(args.meta) as f:
        for line in f:
            meta = json.loads(line)
            row = rows.get(meta["id"])
            if row is None or "alloc" not in meta:
                continue
            value = others.get(meta["id"])
            if not value:
                continue
            print(f"| {meta['id']} | {row['model'].removesuffix('.json')} | {row['method']} | {row['precision']} "
                  f"| {row['batch']} × {row['seq']} | {row['grad_ckpt']} | {row['attention']} "
                  f"| {meta['alloc'] / GIB:.2f} | {value / GIB:.2f} | {100 * (value / meta['alloc'] - 1):+.1f}% |")


if __name__ == "__main__":
    main()
