#!/usr/bin/env python3
"""The seed's LowMemDataset, reproduced with pyarrow, measured the way `memfit bench data` is.

Modes, as the seed implemented them:
- standard: `pq.read_table(path)` once (the whole decompressed table stays in the process), then
  `table.slice(i, 1)` per sample;
- ultra: re-reads (and decompresses) the whole file for every sample: `pq.read_table(path).slice(i, 1)`.

    python benches/seed_loader.py --mode standard --file rows.parquet --random 10000 --json

Prints {"mode", "rows", "ns_per_row_median", "peak_rss_bytes"}; time per row is measured per
access (time.perf_counter_ns) and the median reported; peak RSS is the process's ru_maxrss.
"""
import argparse
import json
import random
import resource
import statistics
import time

import pyarrow.parquet as pq


class LowMemDataset:
    def __init__(self, path: str, mode: str):
        self.path = path
        self.mode = mode
        if mode == "standard":
            self.table = pq.read_table(path)
            self.rows = self.table.num_rows
        else:
            self.table = None
            self.rows = pq.ParquetFile(path).metadata.num_rows

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, i: int):
        table = self.table if self.mode == "standard" else pq.read_table(self.path)
        row = table.slice(i, 1)
        return row.column("prompt")[0].as_py(), row.column("response")[0].as_py()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["standard", "ultra"], required=True)
    ap.add_argument("--file", required=True)
    ap.add_argument("--random", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    ds = LowMemDataset(args.file, args.mode)
    rng = random.Random(args.seed)
    picks = [rng.randrange(len(ds)) for _ in range(args.random)]
    times = []
    checksum = 0
    for i in picks:
        t = time.perf_counter_ns()
        prompt, response = ds[i]
        checksum += len(prompt) + len(response)
        times.append(time.perf_counter_ns() - t)
    report = {
        "mode": args.mode,
        "rows": args.random,
        "ns_per_row_median": float(statistics.median(times)),
        # ru_maxrss is in KiB on Linux.
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(report)


if __name__ == "__main__":
    main()
