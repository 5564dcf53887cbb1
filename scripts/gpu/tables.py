#!/usr/bin/env python3
"""The tables of docs/gpu.md from what scripts/gpu/accept.sh wrote into one folder (stdlib only).

usage: tables.py OUT_DIR > gpu.md
"""
import glob
import json
import math
import os
import re
import sys
import time

# Dense bf16 tensor-core peaks (NVIDIA's data sheets, SXM parts): what MFU is reported against.
BF16_PEAK = {"H100": 989e12, "H200": 989e12, "A100": 312e12}
# Parity bounds of issue 27: relative loss difference over 20 steps.
PARITY_TOL = {"fp32": 1e-4, "bf16": 1e-2}


def fmt(loss):
    """A loss to 4 decimals; null (NaN or infinite in the run) as "nan"."""
    return "nan" if loss is None else f"{loss:.4f}"


def rows(folder, name):
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path) if line.strip()]


def card(folder):
    check = os.path.join(folder, "check.json")
    try:
        gpus = json.load(open(check)).get("gpus") or []
    except (OSError, ValueError):
        gpus = []
    return gpus[0].get("name", "?") if gpus else "no GPU"


def peak_for(name):
    return next((v for k, v in BF16_PEAK.items() if k in name), None)


def parity(device_runs, cpu_runs, build=""):
    """Each device run beside the CPU run of its setup; `build` names a build other than the plain
    one (its section is left out when it did not run)."""
    if build and not device_runs:
        return
    which = f" (the `{build}` build)" if build else ""
    print(f"## Parity: the same 20 steps on the GPU{which} and on the CPU\n")
    print("| model | precision | loss first → last (GPU) | (CPU) | worst step rel. diff | bound | ok |")
    print("| --- | --- | --- | --- | ---: | ---: | --- |")
    key = lambda r: tuple(r.get("setup", {}).get(k) for k in ("model", "training", "precision", "dropout"))
    on_cpu = {key(r): r for r in cpu_runs if "setup" in r}
    for gpu in device_runs:
        cpu = on_cpu.get(key(gpu), {"error": "no CPU run"})
        model, training, precision, dropout = key(gpu)
        if "losses" not in gpu:
            print(f"| {gpu.get('command', '')[:70]} | | failed (exit {gpu.get('exit')}): "
                  f"{str(gpu.get('error'))[:100]} | | | | no |")
            continue
        if "losses" not in cpu:
            print(f"| {model} | {precision} | | failed on the CPU: {str(cpu.get('error'))[:80]} | | | no |")
            continue
        # a non-finite loss is written as null: it fails the row whatever the bound
        worst = max((abs(a - b) / max(abs(b), 1e-12) if a is not None and b is not None else math.inf)
                    for a, b in zip(gpu["losses"], cpu["losses"]))
        tol = PARITY_TOL.get(precision, 1e-2)
        kind = ("LoRA" if "Lora" in str(training) else "") + (f" dropout {dropout:g}" if dropout else "")
        print(f"| {model} {kind} | {precision} | {fmt(gpu['loss_first'])} → {fmt(gpu['loss_last'])} | "
              f"{fmt(cpu['loss_first'])} → {fmt(cpu['loss_last'])} | {worst:.2e} | {tol:g} | "
              f"{'yes' if worst <= tol else 'NO'} |")
    print()


def preflight(records):
    for i, r in enumerate(records):
        steps = r.get("step_seconds") or []
        which = ("Preflight: the tiny T5", "Again, in a second process (kernels from the disk cache):")[min(i, 1)]
        if steps:
            print(f"{which} trained 4 steps on {r.get('device')} in {r.get('wall_s')} s "
                  f"(first step {steps[0]:.2f} s; then {steps[-1]:.3f} s).\n")
        else:
            print(f"{which} FAILED (exit {r.get('exit')}): {str(r.get('error'))[:300]}\n")


TORCH_BENCH = {"t5": 0, "bert_cls": 1, "causal_lora": 2, "causal_full": 2}


def torch_by_shape(torch):
    """PyTorch's records per speed shape (0 t5, 1 bert, 2 the decoder): eager, and the fastest
    compiled mode (torch.compile's), with that mode's name."""
    eager, compiled = {}, {}
    for t in torch:
        i = TORCH_BENCH.get(t.get("bench"))
        if i is None:
            continue
        if t.get("compile", "none") == "none":
            eager.setdefault(i, t)
        elif (t.get("tokens_per_s") or 0) > (compiled.get(i, {}).get("tokens_per_s") or 0):
            compiled[i] = t
    return eager, compiled


def speed(records, gpu_name):
    """The issue's speed table: memfit beside PyTorch eager and PyTorch compiled (its fastest
    mode), same card, bf16, medians after warm-up; then what memfit predicted and its first step."""
    print("## Speed and memory beside PyTorch on the same card (bf16)\n")
    peak = peak_for(gpu_name)
    memfit = [r for r in records if "placement" in r]
    eager, compiled = torch_by_shape([r for r in records if "bench" in r])
    ratio = lambda a, b: f"{a / b:.2f}" if a and b else "—"
    print("| shape | memfit tokens/s | PyTorch eager tokens/s | ratio | PyTorch compiled tokens/s | ratio "
          "| memfit NVML MiB | PyTorch eager NVML MiB | ratio | memfit MFU |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    details = []
    for i, m in enumerate(memfit):
        s = m.get("setup", {})
        shape = f"{s.get('model')} b{s.get('batch')} s{s.get('seq')}"
        e, c = eager.get(i, {}), compiled.get(i, {})
        mfu = (m["model_flops_per_step"] / m["sec_per_step_median"] / peak
               if peak and m.get("sec_per_step_median") else None)
        tps, etps, ctps = m.get("tokens_per_s"), e.get("tokens_per_s"), c.get("tokens_per_s")
        mm, em = m.get("nvml_peak_mib"), e.get("nvml_peak_mib")
        print(f"| {shape} | {tps or 0:.0f} | {etps or 0:.0f} | {ratio(tps, etps)} | {ctps or 0:.0f} | "
              f"{ratio(tps, ctps)} | {mm} | {em or '—'} | {ratio(mm, em)} | {f'{mfu:.1%}' if mfu else '—'} |")
        steps = m.get("step_seconds") or []
        first = f"{steps[0]:.2f} / {m['sec_per_step_median']:.3f}" if steps else "—"
        predicted = m.get("predicted_gpu_nvml_bytes")
        predicted = f"{predicted / 2**20:.0f}" if predicted else "—"
        details.append(f"| {shape} | {predicted} | {first} | {c.get('compile', '—')} | "
                       f"{c.get('nvml_peak_mib', '—')} |")
    print()
    if details:
        print("| shape | memfit predicted NVML MiB | memfit first step s (kernel compiles) / median s "
              "| PyTorch compiled: mode | its NVML MiB |")
        print("| --- | ---: | ---: | --- | ---: |")
        print("\n".join(details) + "\n")


def matmul(memfit_rows, torch_rows):
    """Each product of a speed shape's step timed alone: memfit (cubecl's matmul) beside
    torch.matmul (cuBLAS) on the same shapes and layouts, the largest share of memfit's first."""
    if not memfit_rows:
        return
    print("## The step's matrix products alone: memfit beside torch.matmul (bf16)\n")
    key = lambda r: (r["setup"]["model"], r["pass"], r["batch"], r["m"], r["k"], r["n"], r["lhs_t"], r["rhs_t"])
    torch = {key(t): t for t in torch_rows if "setup" in t}
    models = []
    for r in memfit_rows:
        if "setup" in r and r["setup"]["model"] not in models:
            models.append(r["setup"]["model"])
    for model in models:
        rows = [r for r in memfit_rows if r.get("setup", {}).get("model") == model]
        s = rows[0]["setup"]
        ours = sum(r["seconds_median"] * r["count"] for r in rows)
        theirs = [torch.get(key(r)) for r in rows]
        total = (sum(t["torch_seconds_median"] * r["count"] for r, t in zip(rows, theirs))
                 if all(theirs) else None)
        vs = f"; torch.matmul {total * 1e3:.2f} ms (ratio {total / ours:.2f})" if total else ""
        print(f"**{model}** b{s['batch']} s{s['seq']} ({s['method']}): {len(rows)} products, "
              f"{ours * 1e3:.2f} ms a step one after the other{vs}.\n")
        print("| product | pass | layout | batch × m × k × n | count | memfit µs | torch µs | ratio "
              "| memfit TFLOP/s | torch TFLOP/s | share of memfit's |")
        print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r, t in sorted(zip(rows, theirs), key=lambda rt: -rt[0]["seconds_median"] * rt[0]["count"])[:12]:
            tus = (t or {}).get("torch_seconds_median")
            ours_us = r["seconds_median"] * 1e6
            # ratio: torch's time over memfit's (above 1: memfit's product is the faster)
            theirs_cols = (f"{tus * 1e6:.1f} | {tus * 1e6 / ours_us:.2f}" if tus else "— | —")
            theirs_rate = f"{t['torch_tflops']:.1f}" if tus else "—"
            print(f"| {r['what'][:50]} | {r['pass']} | {r['layout']} | {r['batch']} × {r['m']} × {r['k']} × "
                  f"{r['n']} | {r['count']} | {ours_us:.1f} | {theirs_cols} | {r['tflops']:.1f} | "
                  f"{theirs_rate} | {r['seconds_median'] * r['count'] / ours:.1%} |")
        print()


def fusion(plain, fused):
    """The speed shapes with burn's fusion beside the plain build, paired by setup."""
    if not fused:
        return
    print("## The speed shapes with burn's kernel fusion (the `fusion` build)\n")
    print("| shape | plain tokens/s | fusion tokens/s | ratio | plain NVML peak MiB | fusion | last loss "
          "rel. diff |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    key = lambda r: json.dumps(r.get("setup"), sort_keys=True)
    by_setup = {key(r): r for r in plain if "placement" in r}
    for f in fused:
        s = f.get("setup")
        if not s:
            print(f"| failed: {f.get('command', '')[:60]} (exit {f.get('exit')}) | | | | | | |")
            continue
        p = by_setup.get(key(f), {})
        a, b = p.get("tokens_per_s"), f.get("tokens_per_s")
        la, lb = p.get("loss_last"), f.get("loss_last")
        diff = f"{abs(lb - la) / abs(la):.1e}" if la and lb is not None else "—"
        print(f"| {s.get('model')} b{s.get('batch')} s{s.get('seq')} | {a or 0:.0f} | {b or 0:.0f} | "
              f"{f'{b / a:.2f}' if a and b else '—'} | {p.get('nvml_peak_mib', '—')} | "
              f"{f.get('nvml_peak_mib', '—')} | {diff} |")
    print()


def memory(records):
    print("## memfit's GPU memory at three sizes per family (fp32), beside memfit's GPU model\n")
    print("Predicted: `memfit estimate --runtime memfit --device cuda` for the same run (the planner's "
          "`memfit_device` model; allocated = its tensors, NVML = + the CUDA context). Error = "
          "predicted / measured − 1.\n")
    print("Pool reserved: after the last step, and (peak) the highest of its readings after each step.\n")
    print("| model | batch × seq | pool in use MiB | pool reserved MiB | (peak) | predicted allocated MiB | "
          "error vs reserved | NVML peak MiB | (in the run's second half) | predicted NVML MiB | "
          "error vs NVML | s/step |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    mib = lambda b: f"{b / 2**20:.0f}" if b is not None else "—"

    def error(predicted, measured):
        if predicted is None or not measured:
            return "—"
        return f"{100 * (predicted / measured - 1):+.1f}%"

    for r in records:
        s = r.get("setup", {})
        if not s:
            print(f"| failed: {r.get('command', '')[:60]} | | | | | | | | | | | |")
            continue
        reserved, nvml = r.get("gpu_pool_reserved_bytes"), r.get("nvml_peak_mib")
        allocated, nvml_predicted = r.get("predicted_gpu_allocated_bytes"), r.get("predicted_gpu_nvml_bytes")
        nvml_bytes = nvml * 2**20 if isinstance(nvml, (int, float)) else None
        print(f"| {s.get('model')} {'LoRA' if 'Lora' in str(s.get('training')) else ''} | "
              f"{s.get('batch')} × {s.get('seq')} | {mib(r.get('gpu_pool_in_use_bytes'))} | "
              f"{mib(reserved)} | {mib(r.get('gpu_pool_reserved_peak_bytes'))} | {mib(allocated)} | "
              f"{error(allocated, reserved)} | {nvml} | "
              f"{r.get('nvml_late_peak_mib', '—')} | "
              f"{mib(nvml_predicted)} | {error(nvml_predicted, nvml_bytes)} | "
              f"{r.get('sec_per_step_median', 0):.3f} |")
    print()


def resume(records):
    print("## Kill and resume\n")
    for r in records:
        print(f"- stopped by SIGTERM: exit {r['stopped_exit']}; resumed: exit {r['resumed_exit']}; "
              f"{r['steps_resumed']} of {r['steps_whole']} steps logged; worst relative loss "
              f"difference against the uninterrupted run: {r['worst_rel_loss_diff']}")
    print()


def out_of_memory(records):
    print("## A micro-batch that does not fit: CUDA out-of-memory caught and halved\n")
    for r in records:
        downs = r["downgrades"]
        start = downs[0]["old_micro_batch"] if downs else r["asked_micro_batch"]
        chain = " → ".join([str(start)] + [str(d["new_micro_batch"]) for d in downs])
        reasons = sorted({d["reason"] for d in downs if d.get("reason")})
        stop = r["stop"]
        print(f"- exit {r['exit']}; micro-batch {chain} ({len(downs)} caught error(s), reason "
              f"{', '.join(reasons) or '—'}); checkpoints at steps {r['checkpoints']}; "
              f"{'stopped: ' + str(stop.get('reason')) if stop else 'finished'}")
        if downs:
            print(f"  first error: {str(downs[0].get('message'))[:200]}")
    print()


def kernel_times(log):
    """Each kernel's device time and launches in `log`, by name. cubecl's profiler (level basic)
    writes a line per launch, `| <time> | <name>`, the name itself holding `|` between its parts."""
    units = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}
    totals = {}
    for line in open(log, encoding="utf-8", errors="replace"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        m = re.fullmatch(r"([0-9.]+)(ns|µs|us|ms|s)", cells[0])
        if not m or len(cells) < 2:
            continue
        t = totals.setdefault(kernel_name(cells[1:]), [0.0, 0])
        t[0] += float(m.group(1)) * units[m.group(2)]
        t[1] += 1
    return totals


def kernel_name(parts):
    """A launch's kernel without its specialisation's hash; a long generic name (cubek's matmul
    lists its whole configuration) as its first and last parts."""
    parts = [re.sub(r"_[0-9a-f]{8}$", "", p) for p in parts]
    return " ".join(parts) if len(parts) <= 2 else f"{parts[0]} … {parts[-1]}"


def profile_logs(folder):
    """The profile logs of each speed shape by step count, `{shape: {steps: path}}`: accept.sh writes
    `profile-SHAPE-STEPS.log`; a log named without a count (before 2026-12-06) ran 5 steps."""
    runs = {}
    for log in sorted(glob.glob(os.path.join(folder, "profile-*.log"))):
        name = os.path.basename(log)[len("profile-"):-len(".log")]
        m = re.fullmatch(r"(.+)-([0-9]+)", name)
        shape, steps = (m.group(1), int(m.group(2))) if m else (name, 5)
        runs.setdefault(shape, {})[steps] = log
    return runs


def steady_state(runs):
    """Per kernel, launches and seconds a step past the first steps: the longest run's totals less
    the shortest's, over the steps between them (process start, compiles and autotune, which both
    runs pay alike, cancel out). One run alone: its totals over all its steps."""
    longest = max(runs)
    totals = kernel_times(runs[longest])
    shortest = min(runs)
    if shortest == longest:
        return totals, longest, False
    early = kernel_times(runs[shortest])
    per_step = {}
    for name, (t, n) in totals.items():
        t0, n0 = early.get(name, (0.0, 0))
        if n - n0 > 0:
            per_step[name] = (max(t - t0, 0.0), n - n0)
    return per_step, longest - shortest, True


def profiles(folder, speed_records=()):
    """Each speed shape's steady-state kernels; beside them the unprofiled run's median step (from
    `speed_records`, by model): what the kernels leave of it is the device idle, waiting on the host."""
    step_of = {r["setup"].get("model"): r["sec_per_step_median"] for r in speed_records
               if "placement" in r and r.get("sec_per_step_median")}
    runs_by_shape = profile_logs(folder)
    print("## Where the GPU time goes (cubecl's per-kernel profile, the speed shapes)\n")
    if not runs_by_shape:
        print("- no cubecl profile: the runs did not compute on a cubecl device\n")
        return
    for shape, runs in runs_by_shape.items():
        totals, steps, steady = steady_state(runs)
        whole = sum(t for t, _ in totals.values()) or 1.0
        launches = sum(n for _, n in totals.values())
        if not launches:
            print(f"**{shape}** — no launch logged (the run failed: accept.log)\n")
            continue
        which = (f"steps {min(runs) + 1}–{max(runs)}: the {max(runs)}-step run less the {min(runs)}-step "
                 "one, so the first steps' kernel compiles and autotune are out" if steady
                 else f"{steps} steps of one run, its first steps' autotune included")
        print(f"**{shape}** — {whole / steps * 1e3:.1f} ms of kernels a step, {launches / steps:.0f} "
              f"launches a step ({which}; every kernel timed with a sync after it)\n")
        step = step_of.get(shape)
        if step:
            computes = min(whole / steps / step, 1.0)
            idle = 1 - computes
            print(f"The unprofiled run's median step is {step * 1e3:.1f} ms: the device computes "
                  f"{computes:.0%} of it and waits {idle:.0%} (the host's launches "
                  f"and reads), {idle * step / max(launches / steps, 1) * 1e6:.1f} µs a launch.\n")
        print("| kernel | launches a step | ms a step | share |")
        print("| --- | ---: | ---: | ---: |")
        for name, (t, n) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:15]:
            print(f"| `{name[:90]}` | {n / steps:.0f} | {t / steps * 1e3:.3f} | {t / whole:.1%} |")
        print()


def main():
    folder = sys.argv[1]
    gpu = card(folder)
    print(f"# memfit on {gpu} — scripts/gpu/accept.sh, {time.strftime('%Y-%m-%d')}\n")
    kernels_off = os.path.join(folder, "gpu-kernels-off")
    if os.path.exists(kernels_off):
        with open(kernels_off) as f:
            print("**memfit's own GPU kernels were off (`MEMFIT_GPU_KERNELS=off`, burn's composite ops): the first "
                  f"preflight failed with them:** {f.read().strip()[:400]}\n")
    preflight(rows(folder, "preflight.jsonl"))
    parity(rows(folder, "parity.jsonl"), rows(folder, "parity-cpu.jsonl"))
    speed(rows(folder, "speed.jsonl"), gpu)
    fusion(rows(folder, "speed.jsonl"), rows(folder, "speed-fusion.jsonl"))
    matmul(rows(folder, "matmul.jsonl"), rows(folder, "matmul-torch.jsonl"))
    parity(rows(folder, "parity-fusion.jsonl"), rows(folder, "parity-cpu.jsonl"), build="fusion")
    memory(rows(folder, "memory.jsonl"))
    out_of_memory(rows(folder, "oom.jsonl"))
    resume(rows(folder, "resume.jsonl"))
    profiles(folder, rows(folder, "speed.jsonl"))


if __name__ == "__main__":
    main()
