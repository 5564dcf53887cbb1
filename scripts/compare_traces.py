#!/usr/bin/env python3
"""Where two allocator traces of the same row part: a card's (`measure_gpu_memory.py --trace-steps`)
and the meta device's (`--device meta`, scripts/meta_trace.py), step by step.

For each step both have, it lines up the sizes of the allocations of at least `--min-mib` MiB in
the order they were made (difflib) and prints the step's counts, bytes and the first runs that differ
(sizes in MiB). Same sizes in the same order: the replay's rules are what differ where its reserved
bytes part from the card's; different ones: the meta trace misses what the card allocates.

    python3 scripts/compare_traces.py CARD.trace.gz META.trace.gz [--steps 3] [--min-mib 1]
"""

import argparse
import difflib
import gzip
import sys

MIB = 1 << 20


def steps_of(path, min_bytes):
    """{step: [bytes of each allocation of at least min_bytes, in order]}; allocations before the
    first step (the model's construction) under -1."""
    steps, current = {-1: []}, -1
    with gzip.open(path, "rt") as f:
        for line in f:
            parts = line.split()
            if parts[0] == "step":
                current = int(parts[1])
                steps[current] = []
            elif parts[0] == "alloc" and int(parts[2]) >= min_bytes:
                steps[current].append(int(parts[2]))
    return steps


def mib(sizes):
    return " ".join(f"{s / MIB:.1f}" for s in sizes)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("card")
    p.add_argument("meta")
    p.add_argument("--steps", type=int, default=3, help="steps to compare (from the model's construction on)")
    p.add_argument("--min-mib", type=float, default=1.0, help="allocations smaller than this are left out")
    p.add_argument("--runs", type=int, default=5, help="differing runs printed per step")
    args = p.parse_args()
    card, meta = (steps_of(path, int(args.min_mib * MIB)) for path in (args.card, args.meta))
    for step in range(-1, args.steps):
        a, b = card.get(step), meta.get(step)
        if a is None or b is None:
            print(f"step {step}: only in {'the meta' if a is None else 'the card'} trace")
            continue
        name = "construction" if step < 0 else f"step {step}"
        print(f"{name}: card {len(a)} allocations, {sum(a) / MIB:.0f} MiB; meta {len(b)}, {sum(b) / MIB:.0f} MiB")
        shown = 0
        for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
            if op == "equal" or shown >= args.runs:
                continue
            shown += 1
            print(f"  {op} at card #{i1} / meta #{j1}: card [{mib(a[i1:i2][:12])}] meta [{mib(b[j1:j2][:12])}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
