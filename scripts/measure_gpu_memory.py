#!/usr/bin/env python3
"""Measures the GPU memory of a few training steps of a transformers model built from a config.json
(random weights: nothing is downloaded), for the rows of validation/measured_here.csv.

Each row of the CSV is a setup in the columns `memfit estimate` reads (validation/README.md). For
each row this script starts a fresh Python process (`--one`), builds the model on the GPU, applies
PEFT LoRA or trains every weight, runs `--steps` steps of forward (loss inside the model, as the
HF Trainer does), backward, `torch.optim.AdamW` (its default multi-tensor path) or SGD, and
`zero_grad(set_to_none=True)`, then reports torch's peak allocated and reserved bytes and the
device's used memory (`torch.cuda.mem_get_info`, the process's CUDA context included).
Each row prints one JSON line, with the last step in phases: bytes allocated when it starts and
after each block's forward, and each phase's peak (validation/measured_here_runs.jsonl keeps them).
`--write FILE` writes the CSV back with `measured_value` (peak allocated, MiB), the GPU and the
versions filled in; a row that runs out of memory gets `oom`.

Usage, on a machine with one CUDA GPU and torch, transformers and peft installed:
    python3 scripts/measure_gpu_memory.py --rows validation/measured_here.csv --write out.csv
One setup by hand (what `memfit calibrate` runs, {batch} replaced):
    python3 scripts/measure_gpu_memory.py --model validation/models/qwen2.5-0.5b.json \
        --method full --precision amp-bf16 --batch 4 --seq 512
"""

import argparse
import csv
import json
import os
import subprocess
import sys
import time

MIB = 1 << 20

# Module names of the adapted linears (validation/README.md `lora_targets`): llama's, and per
# model_type where transformers names them differently.
NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "qkv": "qkv_proj",
         "gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
RENAMED = {"o": {"gptj": "out_proj", "opt": "out_proj", "gpt_neox": "dense"},
           "qkv": {"gpt_neox": "query_key_value"}}


def target_modules(targets, model_type):
    names = []
    for t in targets.split(","):
        if t not in NAMES:
            sys.exit(f"lora_targets: {t!r} is not one of {', '.join(NAMES)}")
        names.append(RENAMED.get(t, {}).get(model_type, NAMES[t]))
    return names


def build(setup, device):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with open(setup["model_path"]) as f:
        fields = json.load(f)
    fields.pop("architectures", None)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    dtype = torch.bfloat16 if setup["precision"] == "bf16" else torch.float32
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            config, dtype=dtype, attn_implementation=setup["attention"])
    model.to(device)
    if setup["grad_ckpt"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if setup["method"] == "lora":
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=setup["lora_r"], lora_alpha=setup["lora_alpha"], lora_dropout=0.05,
                          target_modules=target_modules(setup["lora_targets"], config.model_type),
                          task_type="CAUSAL_LM")
        model = get_peft_model(model, lora)
    model.train()
    return model, config


def measure(setup, device):
    """Peak bytes of `steps` training steps: {"alloc", "reserved", "device_used"} or {"oom": msg}."""
    import torch

    model, config = build(setup, device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if setup["optimizer"] == "adamw":
        opt = torch.optim.AdamW(trainable, lr=1e-5)
    elif setup["optimizer"] == "sgd":
        opt = torch.optim.SGD(trainable, lr=1e-5)
    else:
        sys.exit(f"optimizer {setup['optimizer']!r}: adamw or sgd")
    gen = torch.Generator(device="cpu").manual_seed(1234)
    amp = setup["precision"] == "amp-bf16"
    cuda = device == "cuda"

    def step(probe):
        ids = torch.randint(0, config.vocab_size, (setup["batch"], setup["seq"]), generator=gen)
        ids = ids.to(device)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=amp):
            loss = model(input_ids=ids, labels=ids).loss
        probe("forward")
        loss.backward()
        probe("backward")
        opt.step()
        opt.zero_grad(set_to_none=True)
        probe("step")
        return loss

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    for _ in range(setup["steps"] - 1):
        loss = step(lambda phase: None)
    if not cuda:
        return {"loss": float(step(lambda phase: None).detach())}
    phases = Phases(model)
    loss = step(phases.end)
    free, total = torch.cuda.mem_get_info()
    return {"alloc": phases.peak_alloc, "reserved": phases.peak_reserved,
            "device_used": total - free, "device_total": total, "loss": float(loss.detach()),
            "gpu": torch.cuda.get_device_name(), "versions": versions(), "phases": phases.record}


class Phases:
    """The last step seen in parts: bytes allocated when it starts, after each block's forward, and
    each phase's peak (forward, backward, optimizer step); the run's peaks carried across the resets."""

    def __init__(self, model):
        import torch

        self.cuda = torch.cuda
        torch.cuda.synchronize()
        self.peak_alloc = torch.cuda.max_memory_allocated()
        self.peak_reserved = torch.cuda.max_memory_reserved()
        torch.cuda.reset_peak_memory_stats()
        self.record = {"start": torch.cuda.memory_allocated(), "blocks": []}
        self.in_forward = True
        blocks = [m for name, m in model.named_modules()
                  if isinstance(m, torch.nn.ModuleList) and name.rsplit(".", 1)[-1] in ("layers", "h")]
        for block in blocks[0] if blocks else []:
            block.register_forward_hook(self.after_block)

    def after_block(self, module, inputs, output):
        if self.in_forward:  # not the recomputation of a checkpointed block in backward
            self.record["blocks"].append(self.cuda.memory_allocated())

    def end(self, phase):
        self.in_forward = False
        self.cuda.synchronize()
        peak = self.cuda.max_memory_allocated()
        self.peak_alloc = max(self.peak_alloc, peak)
        self.peak_reserved = max(self.peak_reserved, self.cuda.max_memory_reserved())
        self.record[phase] = {"after": self.cuda.memory_allocated(), "peak": peak}
        self.cuda.reset_peak_memory_stats()


def versions():
    import peft
    import torch
    import transformers

    return f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}"


def setup_of(row, root):
    """A CSV row (or the command line's fields) as the setup `measure` takes."""
    def num(key, default=None):
        return int(row[key]) if row.get(key) else default

    model = row["model"]
    path = model if os.path.sep in model else os.path.join(root, "validation", "models", model)
    return {"model_path": path, "method": row["method"], "precision": row["precision"],
            "optimizer": row["optimizer"], "batch": num("batch"), "seq": num("seq"),
            "grad_ckpt": row.get("grad_ckpt") == "true", "lora_r": num("lora_r", 8),
            "lora_alpha": num("lora_alpha", 16), "lora_targets": row.get("lora_targets") or "q,v",
            "attention": row.get("attention") or "sdpa", "steps": num("steps", 3)}


def run_one(setup, device):
    import torch

    try:
        return measure(setup, device)
    except torch.OutOfMemoryError as e:
        return {"oom": str(e).splitlines()[0]}


def run_rows(args, root):
    with open(args.rows, newline="") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames, list(reader)
    for row in rows:
        if args.only and row["id"] not in args.only.split(","):
            continue
        t = time.time()
        cmd = [sys.executable, __file__, "--one", json.dumps(setup_of(row, root)), "--device", args.device]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"{row['id']}: over {args.timeout} s, skipped", file=sys.stderr, flush=True)
            continue
        if proc.returncode != 0:
            print(f"{row['id']}: exit {proc.returncode}\n{proc.stderr[-3000:]}", file=sys.stderr, flush=True)
            continue
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        print(json.dumps({"id": row["id"], "seconds": round(time.time() - t, 1), **result}), flush=True)
        fill(row, result)
        if args.write:
            write_csv(args.write, fields, rows)


def fill(row, result):
    """Puts a measurement into a row: peak allocated in MiB (or `oom`), the GPU, what else was read."""
    if "oom" in result:
        row["measured_value"], row["measured_unit"] = "oom", ""
        row["notes"] = f"ran out of memory: {result['oom']}"
        return
    if "alloc" not in result:
        return
    row["measured_value"] = f"{result['alloc'] / MIB:.0f}"
    row["measured_unit"] = "MiB"
    row["gpu_name"] = result["gpu"]
    row["gpu_total_gib"] = f"{result['device_total'] / (1 << 30):.2f}"
    row["notes"] = (f"scripts/measure_gpu_memory.py; {result['versions']}; peak reserved "
                    f"{result['reserved'] / MIB:.0f} MiB, device used after the steps "
                    f"{result['device_used'] / MIB:.0f} MiB")


def write_csv(path, fields, rows):
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", help="a CSV of setups (validation/measured_here.csv)")
    p.add_argument("--only", help="comma list of row ids")
    p.add_argument("--write", help="write the CSV with the measurements filled in here")
    p.add_argument("--timeout", type=float, default=300, help="seconds a row may take")
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--device", default="cuda", help="cuda (cpu only checks that the script runs)")
    for key in ("model", "method", "precision", "optimizer", "batch", "seq", "lora_r",
                "lora_alpha", "lora_targets", "attention", "steps"):
        p.add_argument("--" + key.replace("_", "-"), dest=key)
    p.add_argument("--grad-ckpt", action="store_const", const="true", dest="grad_ckpt")
    args = p.parse_args()
    if args.one:
        print(json.dumps(run_one(json.loads(args.one), args.device)))
    elif args.rows:
        run_rows(args, root)
    elif args.model and args.batch and args.seq:
        row = {k: v for k, v in vars(args).items() if v is not None}
        row.setdefault("method", "full")
        row.setdefault("precision", "fp32")
        row.setdefault("optimizer", "adamw")
        print(json.dumps(run_one(setup_of(row, root), args.device)))
    else:
        p.error("give --rows FILE, or --model, --batch and --seq")


if __name__ == "__main__":
    main()
