#!/usr/bin/env python3
"""torch.matmul on the products `memfit bench matmul --json` timed (same shapes, layouts, dtype,
device, and the same timing: the median of ITERS runs, each waited for, after 3 untimed ones).

usage: matmul_torch.py MEMFIT_MATMUL.jsonl [--device cuda] [--iters 20] > torch.jsonl
Each output line is the memfit line's product with "torch_seconds_median" and "torch_tflops".
"""
import argparse
import json
import statistics
import time

import torch


def operand(batch, rows, cols, transposed, dtype, device):
    """A [batch, rows, cols] operand, stored transposed and read through a view where asked."""
    if transposed:
        return torch.randn(batch, cols, rows, dtype=dtype, device=device).transpose(1, 2)
    return torch.randn(batch, rows, cols, dtype=dtype, device=device)


def timed(lhs, rhs, iters, sync):
    seconds = []
    for i in range(3 + iters):
        t0 = time.perf_counter()
        out = torch.matmul(lhs, rhs)
        sync()
        if i >= 3:
            seconds.append(time.perf_counter() - t0)
        del out
    return statistics.median(seconds)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("memfit_jsonl")
    p.add_argument("--device", default="cuda")
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args()
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    for line in open(args.memfit_jsonl):
        line = line.strip()
        if not line.startswith("{"):
            continue
        g = json.loads(line)
        dtype = torch.bfloat16 if g["setup"]["precision"] == "bf16" else torch.float32
        lhs = operand(g["batch"], g["m"], g["k"], g["lhs_t"], dtype, args.device)
        rhs = operand(g["batch"], g["k"], g["n"], g["rhs_t"], dtype, args.device)
        with torch.no_grad():
            s = timed(lhs, rhs, args.iters, sync)
        flops = 2.0 * g["batch"] * g["m"] * g["k"] * g["n"]
        row = {k: g[k] for k in ("what", "pass", "batch", "m", "k", "n", "lhs_t", "rhs_t", "count", "layout")}
        row.update(setup=g["setup"], torch_seconds_median=s, torch_tflops=flops / s / 1e12 if s > 0 else 0.0,
                   torch=torch.__version__)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
