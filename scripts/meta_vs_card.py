#!/usr/bin/env python3
"""The meta device's peak allocated bytes beside a card's, row by row, as a markdown table: how
far `measure_gpu_memory.py --device meta` (scripts/meta_trace.py) stands from what the card
measured for the same rows of validation/measured_here.csv (its runs in measured_here_runs.jsonl;
the largest run's peak where a row ran twice).

    python3 scripts/measure_gpu_memory.py --rows validation/measured_here.csv --only H6,H7 \\
        --device meta > meta.jsonl
    python3 scripts/meta_vs_card.py meta.jsonl
"""

import csv
import json
import os
import sys

GIB = 1 << 30


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    validation = os.path.join(root, "validation")
    card = {}
    with open(os.path.join(validation, "measured_here_runs.jsonl")) as f:
        for line in f:
            run = json.loads(line)
            if "alloc" in run:
                card[run["id"]] = max(card.get(run["id"], 0), run["alloc"])
    with open(os.path.join(validation, "measured_here.csv"), newline="") as f:
        rows = {r["id"]: r for r in csv.DictReader(f)}
    print("| row | model | method | precision | batch × seq | checkpointing | attention | card GiB | meta GiB | meta / card − 1 |")
    print("| --- | --- | --- | --- | --- | --- | --- | ---: | ---: | ---: |")
    with open(sys.argv[1]) as f:
        for line in f:
            meta = json.loads(line)
            row, measured = rows[meta["id"]], card.get(meta["id"])
            if not measured or "alloc" not in meta:
                continue
            print(f"| {meta['id']} | {row['model'].removesuffix('.json')} | {row['method']} | {row['precision']} "
                  f"| {row['batch']} × {row['seq']} | {row['grad_ckpt']} | {row['attention']} "
                  f"| {measured / GIB:.2f} | {meta['alloc'] / GIB:.2f} | {100 * (meta['alloc'] / measured - 1):+.1f}% |")


if __name__ == "__main__":
    main()
