#!/usr/bin/env python3
"""memfit's trainer beside PyTorch + transformers, same shapes, same thread count, same window.

Runs `memfit bench train` and the baseline of `../shared/bench/pytorch/` (bench_t5.py,
bench_bert_cls.py, bench_causal_lora.py) alternately for each configuration and variant, then
prints one Markdown table. Both sides train on synthetic uniform tokens (`--data random` for
PyTorch), AdamW, clip 1.0, and report the median over the steps after the warm-up steps.
CPU-seconds per step are the comparable figure on a loaded machine.

    PY=/path/to/venv/bin/python python3 scripts/bench_vs_pytorch.py --configs b,c --variants f32,ckpt,bf16
    PY=… python3 scripts/bench_vs_pytorch.py --configs bert-small,bert-base --variants f32,bf16
    PY=… python3 scripts/bench_vs_pytorch.py --configs lora-qwen05b --variants f32,bf16base,ckpt

A variant a configuration's family does not have is skipped.

Needs a Python with torch and transformers (see ../shared/bench/pytorch/README.md); stdlib only here.
"""

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASELINES = os.path.join(ROOT, "..", "shared", "bench", "pytorch")

# Issue 6's configurations: (a) tiny, (b) t5-small-like, (c) ChatLM-mini-Chinese.
CONFIGS = {
    "a": {
        "memfit": ["--model", "tiny", "--batch", "8", "--seq", "128"],
        "torch": "--vocab 8000 --d-model 256 --d-ff 1024 --layers 4 --heads 4 --batch 8 --seq 128",
        "steps": 8,
    },
    "b": {
        "memfit": ["--model", "t5-small", "--batch", "8", "--seq", "128"],
        "torch": "--vocab 32128 --d-model 512 --d-ff 2048 --layers 6 --heads 8 --batch 8 --seq 128",
        "steps": 6,
    },
    "c": {
        "memfit": ["--model", "chatlm-mini", "--batch", "4", "--seq", "256"],
        "torch": "--vocab 29298 --d-model 768 --d-ff 3072 --layers 10 --heads 12 --batch 4 --seq 256",
        "steps": 5,
    },
    # run_all.sh's bert-small and bert-base (bench_bert_cls.py)
    "bert-small": {
        "memfit": ["--model", "bert-small", "--task", "classification", "--batch", "8", "--seq", "128"],
        "script": "bench_bert_cls.py",
        "torch": "--vocab 21128 --hidden 256 --layers 4 --heads 4 --batch 8 --seq 128",
        "steps": 15,
    },
    "bert-base": {
        "memfit": ["--model", "bert-base-chinese", "--task", "classification", "--batch", "8",
                   "--seq", "128"],
        "script": "bench_bert_cls.py",
        "torch": "--vocab 21128 --hidden 768 --layers 12 --heads 12 --batch 8 --seq 128",
        "steps": 8,
    },
    # run_all.sh's lora-tiny (a 4-layer Qwen2 shape; its config.json is scripts/configs/lora-tiny.json)
    "lora-tiny": {
        "memfit": ["--model", os.path.join(ROOT, "scripts", "configs", "lora-tiny.json"), "--task",
                   "causal-lm", "--method", "lora", "--batch", "4", "--seq", "256"],
        "script": "bench_causal_lora.py",
        "torch": "--hidden 256 --intermediate 688 --layers 4 --heads 4 --kv-heads 2 --vocab 32000 "
                 "--batch 4 --seq 256",
        "steps": 8,
        "family": "lora",
    },
    # run_all.sh's lora-qwen05b (bench_causal_lora.py's defaults: Qwen2.5-0.5B, r16 on every
    # linear of the blocks, the first half of each row masked)
    "lora-qwen05b": {
        "memfit": ["--model", "qwen2.5-0.5b", "--task", "causal-lm", "--method", "lora",
                   "--batch", "2", "--seq", "512"],
        "script": "bench_causal_lora.py",
        "torch": "--batch 2 --seq 512",
        "steps": 6,
        "family": "lora",
    },
}
VARIANTS = {
    "f32": ([], []),
    "ckpt": (["--grad-ckpt"], ["--grad-ckpt"]),
    "bf16": (["--precision", "bf16"], ["--bf16"]),
}
# LoRA's variants are about its frozen base: f32, bf16 (half its RAM), or with checkpointing.
LORA_VARIANTS = {
    "f32": ([], []),
    "bf16base": (["--base-precision", "bf16"], ["--base-dtype", "bf16"]),
    "ckpt": (["--grad-ckpt"], ["--grad-ckpt"]),
}


def run_json(cmd):
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def gib(b):
    return b / 2**30


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--memfit", default=os.path.join(ROOT, "target", "release", "memfit"))
    p.add_argument("--python", default=os.environ.get("PY", "python3"))
    p.add_argument("--configs", default="b,c")
    p.add_argument("--variants", default="f32,ckpt,bf16")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--raw", help="append every JSON result to this file")
    args = p.parse_args()

    rows = []
    for name in args.configs.split(","):
        cfg = CONFIGS[name]
        variants = LORA_VARIANTS if cfg.get("family") == "lora" else VARIANTS
        for variant in args.variants.split(","):
            if variant not in variants:
                continue
            mf_extra, pt_extra = variants[variant]
            steps = str(cfg["steps"])
            script = os.path.join(BASELINES, cfg.get("script", "bench_t5.py"))
            # bench_causal_lora.py draws random tokens only; the others read parquet by default
            data = [] if cfg.get("family") == "lora" else ["--data", "random"]
            torch_cmd = [args.python, script, *cfg["torch"].split(), "--steps", steps,
                         "--threads", str(args.threads), *data, *pt_extra]
            memfit_cmd = [args.memfit, "bench", "train", *cfg["memfit"], "--steps", steps,
                          "--threads", str(args.threads), "--json", *mf_extra]
            print(f"({name}) {variant}: PyTorch …", file=sys.stderr, flush=True)
            pt = run_json(torch_cmd)
            print(f"({name}) {variant}: memfit …", file=sys.stderr, flush=True)
            mf = run_json(memfit_cmd)
            if args.raw:
                with open(args.raw, "a") as f:
                    for side, r in (("pytorch", pt), ("memfit", mf)):
                        # PyTorch's JSON has a "config" of its own: ours go last and win
                        f.write(json.dumps({**r, "config": name, "variant": variant, "side": side}) + "\n")
            rows.append((name, variant, mf, pt))

    print("| config | variant | memfit CPU-s/step | PyTorch CPU-s/step | speed memfit/PyTorch "
          "| tokens/s memfit / PyTorch | memfit peak RSS | PyTorch peak RSS | RSS memfit/PyTorch "
          "| MFU memfit / PyTorch |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, variant, mf, pt in rows:
        mf_cpu, pt_cpu = mf["cpu_sec_per_step_median"], pt["cpu_s_per_step_median"]
        mf_rss, pt_rss = mf["peak_rss_bytes"], pt["peak_rss_getrusage_mib"] * 2**20
        # Same shapes, so the same model FLOPs: PyTorch's MFU uses memfit's count and peak.
        peak = mf.get("cpu_peak_flops_per_core")
        if peak:
            flops = mf["model_flops_per_step"]
            mfu = f"{100 * flops / (mf_cpu * peak):.1f}% / {100 * flops / (pt_cpu * peak):.1f}%"
        else:
            mfu = "—"
        tps = f"{mf['tokens_per_s']:.0f} / {pt['tokens_per_s']:.0f}"
        print(f"| ({name}) | {variant} | {mf_cpu:.2f} | {pt_cpu:.2f} | {pt_cpu / mf_cpu:.2f}× | {tps} "
              f"| {gib(mf_rss):.2f} GiB | {gib(pt_rss):.2f} GiB | {mf_rss / pt_rss:.3f}× | {mfu} |")


if __name__ == "__main__":
    main()
