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

Lengths that vary from step to step (issue 31: the caching allocator's segments; scripts/gpu/pool.sh
runs the set): `--lengths uniform` or `--lengths lognormal:MU:SIGMA` draws each step's length between
`--length-spread` x seq and seq (lognormal: ln(length) normal, cut to that range), `--steps` of them;
`--expandable-segments` runs the row under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True. Each
step then adds `[length, peak allocated MiB, reserved MiB, segments, inactive split MiB]` to the
JSON line's `per_step`. `--loss shift` computes the loss as transformers and the remote-code models
of 2023 did (logits in the autocast dtype, a shifted contiguous copy, cross-entropy under autocast)
instead of the model's own (today: the logits upcast to fp32); `--autocast` runs bf16 weights under
bf16 autocast as the HF Trainer does with `bf16=True`; `--reentrant` checkpoints with
`use_reentrant=True` (the default before transformers 4.35). `--trace-steps K --trace-dir DIR`
writes the allocator's events of the first K steps (`DIR/ID.trace.gz`: a line per event, `alloc`,
`free`, `segment_alloc`, `segment_free`, `segment_map`, `segment_unmap` with address and bytes, and
`step N` where each step starts; from before the model is built), for
`cargo run --release -p memfit-plan --example replay_allocator`. A Qwen (v1) config is built as
the Qwen2 model of the same shapes (transformers has no `qwen` model type; the tensors are the same,
its fused c_attn as three projections). `--device meta` runs a row without a GPU on PyTorch's
meta device (shapes, no data) for its allocations' order only: with `--trace-steps` it writes the
same trace from every storage an op creates and frees (scripts/meta_trace.py). `--quant nf4-dq` (nf4, fp4, fp4-dq) loads the model
through bitsandbytes' 4-bit quantization, as a QLoRA run does (the random 16-bit weights saved to a
temporary directory and read back quantized; the peaks count from that load on), `--kbit-prep`
then applies PEFT's `prepare_model_for_kbit_training`.
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
RENAMED = {"o": {"gptj": "out_proj", "opt": "out_proj", "gpt_neox": "dense", "phi": "dense",
                 "falcon": "dense", "bloom": "dense"},
           "qkv": {"gpt_neox": "query_key_value", "falcon": "query_key_value",
                   "bloom": "query_key_value"}}


def target_modules(targets, model_type):
    names = []
    if model_type == "qwen2":  # Qwen (v1)'s fused c_attn, built as Qwen2's three projections
        targets = targets.replace("qkv", "q,k,v")
    for t in targets.split(","):
        if t not in NAMES:
            sys.exit(f"lora_targets: {t!r} is not one of {', '.join(NAMES)}")
        names.append(RENAMED.get(t, {}).get(model_type, NAMES[t]))
    return names


def as_transformers_fields(fields):
    """Qwen (v1) is remote code (`model_type` "qwen"): the Qwen2 config of the same shapes. Its
    `intermediate_size` counts both SwiGLU halves; its c_attn has a bias, as Qwen2's q/k/v do."""
    if fields.get("model_type") != "qwen":
        return fields
    return {"model_type": "qwen2", "hidden_size": fields["hidden_size"],
            "intermediate_size": fields["intermediate_size"] // 2,
            "num_attention_heads": fields["num_attention_heads"],
            "num_key_value_heads": fields["num_attention_heads"],
            "num_hidden_layers": fields["num_hidden_layers"], "vocab_size": fields["vocab_size"],
            "max_position_embeddings": fields.get("seq_length", 8192),
            "rms_norm_eps": fields.get("layer_norm_epsilon", 1e-6), "tie_word_embeddings": False}


BNB_4BIT = {"nf4": ("nf4", False), "nf4-dq": ("nf4", True), "fp4": ("fp4", False),
            "fp4-dq": ("fp4", True)}


def load_quantized(model, setup, device):
    """The model as a QLoRA run loads it: its 16-bit weights saved, then read back through
    bitsandbytes' 4-bit quantization (`quant` nf4, nf4-dq, fp4, fp4-dq; compute dtype bf16), the
    peaks counted from the load on (loading and quantizing included). `kbit_prep` applies PEFT's
    `prepare_model_for_kbit_training` (the embedding, head and norms cast to fp32), as PEFT's
    QLoRA recipe does and ms-swift's of 2024 did not."""
    import shutil
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    if setup["quant"] not in BNB_4BIT:
        sys.exit(f"quant {setup['quant']!r}: one of {', '.join(BNB_4BIT)} (bitsandbytes 4-bit)")
    kind, double = BNB_4BIT[setup["quant"]]
    saved = tempfile.mkdtemp(prefix="memfit-qlora-")
    try:
        model.save_pretrained(saved)
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=kind,
                                   bnb_4bit_use_double_quant=double,
                                   bnb_4bit_compute_dtype=torch.bfloat16)
        model = AutoModelForCausalLM.from_pretrained(
            saved, quantization_config=quant, dtype=torch.bfloat16,
            attn_implementation=setup["attention"], device_map={"": device})
    finally:
        shutil.rmtree(saved, ignore_errors=True)
    if setup.get("kbit_prep"):
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    return model


def build(setup, device):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with open(setup["model_path"]) as f:
        fields = as_transformers_fields(json.load(f))
    fields.pop("architectures", None)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    dtype = torch.bfloat16 if setup["precision"] == "bf16" else torch.float32
    attention = setup["attention"]
    if device == "meta" and attention in ("sdpa", "flash_attention_2", "flash2"):
        from meta_trace import register_flash_shapes

        attention = register_flash_shapes()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attention)
    model.to(device)
    if setup.get("quant"):
        model = load_quantized(model, setup, device)
    if setup["grad_ckpt"]:
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": setup.get("reentrant", False)})
        if setup.get("reentrant"):
            model.enable_input_require_grads()  # what the reentrant form needs to reach LoRA
    if setup["method"] == "lora":
        from peft import LoraConfig, get_peft_model

        targets = target_modules(setup["lora_targets"], config.model_type)
        # PEFT stops only when no target matches: a misnamed one would go unmeasured
        present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        missing = [t for t in targets if t not in present]
        if missing:
            sys.exit(f"lora_targets: no {', '.join(missing)} in the {config.model_type} model")
        lora = LoraConfig(r=setup["lora_r"], lora_alpha=setup["lora_alpha"], lora_dropout=0.05,
                          target_modules=targets, task_type="CAUSAL_LM")
        model = get_peft_model(model, lora)
    model.train()
    return model, config


def measure(setup, device):
    """Peak bytes of `steps` training steps: {"alloc", "reserved", "device_used"} or {"oom": msg}."""
    import torch

    cuda, meta = device == "cuda", device == "meta"
    # from before the model is built, so that a replay starts from the same empty allocator
    trace = None
    if meta:
        from meta_trace import MetaTrace

        trace = MetaTrace(setup)  # the peak allocated; the trace where trace_steps asks for it
    elif cuda and setup.get("trace_steps"):
        trace = Trace(setup)
    model, config = build(setup, device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if setup["optimizer"] == "adamw":
        # the multi-tensor implementation PyTorch takes on CUDA (on meta it would take another)
        opt = torch.optim.AdamW(trainable, lr=1e-5, foreach=True if meta else None)
    elif setup["optimizer"] == "sgd":
        opt = torch.optim.SGD(trainable, lr=1e-5)
    else:
        sys.exit(f"optimizer {setup['optimizer']!r}: adamw or sgd")
    gen = torch.Generator(device="cpu").manual_seed(1234)
    lengths = step_lengths(setup)
    amp = setup["precision"] == "amp-bf16" or setup.get("autocast", False)

    def step(index, probe):
        ids = torch.randint(0, config.vocab_size, (setup["batch"], lengths[index]), generator=gen)
        ids = ids.to(device)
        if trace:
            trace.step(index)
        # the meta device has no autocast: training_loss makes its one cast on this path
        with torch.autocast(device_type="cpu" if meta else device, dtype=torch.bfloat16,
                            enabled=amp and not meta):
            loss = training_loss(model, ids, setup.get("loss", "model"), upcast=amp and meta)
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
    per_step, peaks = [], {"alloc": 0, "reserved": 0}
    for index in range(len(lengths) - 1):
        loss = step(index, lambda phase: None)
        if cuda:
            per_step.append(step_stats(torch, lengths[index], peaks))
    if meta:
        step(len(lengths) - 1, lambda phase: None)
        trace.close()
        return {"alloc": trace.peak, "steps": len(lengths), "lengths": lengths,
                "trace": trace.path if setup.get("trace_steps") else None, "versions": versions()}
    if not cuda:
        return {"loss": float(step(len(lengths) - 1, lambda phase: None).detach())}
    phases = Phases(model)
    loss = step(len(lengths) - 1, phases.end)
    last = step_stats(torch, lengths[-1], peaks)
    last[1] = round(max(phases.record[p]["peak"] for p in ("forward", "backward", "step")) / MIB, 1)
    per_step.append(last)  # its peak from the phases, which reset the counter as they went
    if trace:
        trace.write()
    free, total = torch.cuda.mem_get_info()
    result = {"alloc": max(phases.peak_alloc, peaks["alloc"]),
              "reserved": max(phases.peak_reserved, peaks["reserved"]),
              "device_used": total - free, "device_total": total, "loss": float(loss.detach()),
              "gpu": torch.cuda.get_device_name(), "versions": versions(), "phases": phases.record}
    if len(set(lengths)) > 1 or setup.get("expandable_segments"):
        result["per_step"] = per_step
        result["alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    return result


def step_lengths(setup):
    """Each step's sequence length: `seq` every step, or drawn between `length_spread` x seq and
    seq (`lengths` uniform, or lognormal:MU:SIGMA: ln(length) normal, cut to the range) from the
    row's seed."""
    import math
    import random

    seq, steps = setup["seq"], setup["steps"]
    kind = setup.get("lengths") or "fixed"
    if kind == "fixed":
        return [seq] * steps
    shortest = max(2, math.ceil(setup.get("length_spread", 1.0) * seq))
    draw = random.Random(setup.get("seed", 42))
    if kind == "uniform":
        return [draw.randint(shortest, seq) for _ in range(steps)]
    if kind.startswith("lognormal:"):
        # ln(length) normal, cut to [shortest, seq]: drawn through the inverse of its CDF, so a
        # range far in the tail costs no redraws
        from statistics import NormalDist

        mu, sigma = (float(x) for x in kind.split(":")[1:3])
        normal = NormalDist(mu, sigma)
        low, high = normal.cdf(math.log(shortest)), normal.cdf(math.log(seq))
        if high - low < 1e-12:
            sys.exit(f"lengths {kind!r}: no weight between {shortest} and {seq} tokens")
        return [min(seq, max(shortest, round(math.exp(normal.inv_cdf(low + draw.random() * (high - low))))))
                for _ in range(steps)]
    sys.exit(f"lengths {kind!r}: fixed, uniform or lognormal:MU:SIGMA")


def training_loss(model, ids, how, upcast=False):
    """The step's loss as the training code computes it: `model` = the model's own (today's
    transformers upcast the logits to fp32 and shift the labels); `shift` = transformers' and the
    remote-code models' loss of 2023 (a shifted contiguous copy of the logits in the autocast dtype,
    cross-entropy under autocast). The outputs are dropped before backward, as the Trainer's
    compute_loss returns only the loss. `upcast`: the fp32 copy autocast makes for cross-entropy,
    made here where autocast cannot run (the meta device)."""
    import torch

    if how == "model":
        return model(input_ids=ids, labels=ids).loss
    if how != "shift":
        sys.exit(f"loss {how!r}: model or shift")
    logits = model(input_ids=ids).logits
    shifted = logits[..., :-1, :].contiguous()
    del logits
    if upcast:
        shifted = shifted.float()
    return torch.nn.functional.cross_entropy(shifted.view(-1, shifted.size(-1)), ids[..., 1:].reshape(-1))


def step_stats(torch, length, peaks):
    """[length, peak allocated MiB, reserved MiB, segments, inactive split MiB] after a step; the
    peak is the step's own (reset here, so the run's peaks are carried in `peaks`)."""
    stats = torch.cuda.memory_stats()
    peaks["alloc"] = max(peaks["alloc"], stats["allocated_bytes.all.peak"])
    peaks["reserved"] = max(peaks["reserved"], stats["reserved_bytes.all.peak"])
    row = [length, round(stats["allocated_bytes.all.peak"] / MIB, 1),
           round(stats["reserved_bytes.all.current"] / MIB, 1), stats["segment.all.current"],
           round(stats["inactive_split_bytes.all.current"] / MIB, 1)]
    torch.cuda.reset_peak_memory_stats()
    return row


class Trace:
    """The caching allocator's events from the model's construction to the end of the first
    `trace_steps` steps, written compactly for memfit-plan's `replay_allocator` example; a step
    marker where each step starts (the number of events seen then)."""

    def __init__(self, setup):
        import torch

        self.torch, self.steps = torch, setup["trace_steps"]
        self.path = os.path.join(setup.get("trace_dir") or ".", f"{setup.get('id', 'run')}.trace.gz")
        self.starts = []
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                                 max_entries=4_000_000)

    def step(self, index):
        if index < self.steps:
            self.starts.append(len(self.events()))
        elif index == self.steps:
            self.final = self.events()
            self.torch.cuda.memory._record_memory_history(enabled=None)

    def events(self):
        return self.torch.cuda.memory._snapshot()["device_traces"][0]

    def write(self):
        import gzip

        events = getattr(self, "final", None) or self.events()
        keep = {"alloc", "free_completed", "segment_alloc", "segment_free", "segment_map",
                "segment_unmap", "oom"}
        marks = list(enumerate(self.starts))  # (step, events seen when it started), in order
        with gzip.open(self.path + ".tmp", "wt") as f:
            for i, e in enumerate(events):
                while marks and marks[0][1] <= i:
                    f.write(f"step {marks.pop(0)[0]}\n")
                if e["action"] in keep:
                    action = "free" if e["action"] == "free_completed" else e["action"]
                    f.write(f"{action} {e.get('addr', 0):x} {e['size']}\n")
            for step, _ in marks:
                f.write(f"step {step}\n")
        os.replace(self.path + ".tmp", self.path)


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

    def flag(key):
        return row.get(key) in ("true", True)

    model = row["model"]
    path = model if os.path.sep in model else os.path.join(root, "validation", "models", model)
    return {"id": row.get("id", "run"), "model_path": path, "method": row["method"],
            "precision": row["precision"], "optimizer": row["optimizer"], "batch": num("batch"),
            "seq": num("seq"), "grad_ckpt": flag("grad_ckpt"), "lora_r": num("lora_r", 8),
            "lora_alpha": num("lora_alpha", 16), "lora_targets": row.get("lora_targets") or "q,v",
            "attention": row.get("attention") or "sdpa", "steps": num("steps", 3),
            "lengths": row.get("lengths") or "fixed",
            "length_spread": float(row.get("length_spread") or 1.0),
            "expandable_segments": flag("expandable_segments"), "loss": row.get("loss") or "model",
            "autocast": flag("autocast"), "reentrant": flag("reentrant"),
            "trace_steps": num("trace_steps", 0), "trace_dir": row.get("trace_dir"),
            "seed": num("seed", 42), "quant": row.get("quant") or "", "kbit_prep": flag("kbit_prep")}


def child_env(setup):
    """The environment a row's process starts with: the allocator's configuration is read once,
    when torch first touches CUDA."""
    env = dict(os.environ)
    if setup.get("expandable_segments"):
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    return env


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
    began = time.time()
    for row in rows:
        if args.only and row["id"] not in args.only.split(","):
            continue
        if args.budget and time.time() - began > args.budget:
            print(f"{row['id']}: not started, past --budget {args.budget} s", file=sys.stderr, flush=True)
            continue
        t = time.time()
        setup = setup_of(row, root)
        if args.trace_dir:
            setup["trace_dir"] = args.trace_dir
        cmd = [sys.executable, __file__, "--one", json.dumps(setup), "--device", args.device]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                                  env=child_env(setup))
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
    """Puts a measurement into a row: peak allocated in MiB (peak reserved where the row's `metric`
    is RES; or `oom`), the GPU, what else was read."""
    if "oom" in result:
        row["measured_value"], row["measured_unit"] = "oom", ""
        row["notes"] = f"ran out of memory: {result['oom']}"
        return
    if "gpu" not in result:  # a meta device's run: no measurement
        return
    peak = result["reserved"] if row.get("metric") == "RES" else result["alloc"]
    row["measured_value"] = f"{peak / MIB:.0f}"
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
    p.add_argument("--budget", type=float, help="start no row after this many seconds")
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--device", default="cuda",
                   help="cuda; meta: the allocations' order without a GPU, for --trace-steps "
                        "(scripts/meta_trace.py); cpu only checks that the script runs")
    for key in ("model", "method", "precision", "optimizer", "batch", "seq", "lora_r",
                "lora_alpha", "lora_targets", "attention", "steps", "lengths", "length_spread",
                "loss", "trace_steps", "trace_dir", "seed", "id", "quant"):
        p.add_argument("--" + key.replace("_", "-"), dest=key)
    for key in ("grad_ckpt", "expandable_segments", "autocast", "reentrant", "kbit_prep"):
        p.add_argument("--" + key.replace("_", "-"), action="store_const", const="true", dest=key)
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
        setup = setup_of(row, root)
        os.environ.update(child_env(setup))  # before torch is imported
        print(json.dumps(run_one(setup, args.device)))
    else:
        p.error("give --rows FILE, or --model, --batch and --seq")


if __name__ == "__main__":
    main()
