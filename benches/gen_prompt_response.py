#!/usr/bin/env python3
"""Generates a prompt/response parquet file shaped like the ChatLM fixtures (two string columns,
GZIP, one row group by default) for the loader and prepare benchmarks.

    python benches/gen_prompt_response.py --rows 1000000 --out target/bench-data/rows-1m.parquet

Text is built from a fixed pool of fragments (CJK characters, ASCII words, digits, punctuation)
with a seeded generator, so the same arguments always give the same file. Prompts are 8-60
characters, responses 20-400 (the range of the ChatLM fixtures).
"""
import argparse
import random

import pyarrow as pa
import pyarrow.parquet as pq

CJK = [chr(c) for c in range(0x4E00, 0x4E00 + 3000)]
ASCII_WORDS = ["memory", "model", "train", "data", "token", "rust", "python", "GPU", "batch",
               "2021", "3.11", "OK", "hello", "world", "loss", "step"]
PUNCT = ["，", "。", "？", "！", "、", ",", ".", "?", " "]


def fragment_pool(rng: random.Random, size: int) -> list:
    pool = []
    for _ in range(size):
        n = rng.randint(2, 12)
        parts = []
        for _ in range(n):
            r = rng.random()
            if r < 0.8:
                parts.append(rng.choice(CJK))
            elif r < 0.9:
                parts.append(rng.choice(ASCII_WORDS))
            else:
                parts.append(rng.choice(PUNCT))
        pool.append("".join(parts))
    return pool


def text(rng: random.Random, pool: list, lo: int, hi: int) -> str:
    target = rng.randint(lo, hi)
    out = []
    length = 0
    while length < target:
        f = rng.choice(pool)
        out.append(f)
        length += len(f)
    return "".join(out)[:target]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compression", default="gzip")
    ap.add_argument("--row-group-size", type=int, default=0, help="0: one row group (as the fixtures)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    pool = fragment_pool(rng, 20000)
    chunks = []
    chunk = 100_000
    for start in range(0, args.rows, chunk):
        n = min(chunk, args.rows - start)
        prompts = [text(rng, pool, 8, 60) for _ in range(n)]
        responses = [text(rng, pool, 20, 400) for _ in range(n)]
        chunks.append(pa.record_batch([pa.array(prompts, pa.string()), pa.array(responses, pa.string())],
                                      names=["prompt", "response"]))
    table = pa.Table.from_batches(chunks)
    pq.write_table(table, args.out, compression=args.compression,
                   row_group_size=args.row_group_size or max(args.rows, 1))


if __name__ == "__main__":
    main()
