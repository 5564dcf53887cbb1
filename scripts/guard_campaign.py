#!/usr/bin/env python3
"""The memory-guard campaign of issue 50: its numbered cases and the families of the campaign before
it (kills and signals at random moments, racing starts, guarded process shapes), each run N times
against a built memfit; prints k/n per family and, with --json, one line per trial.

usage: scripts/guard_campaign.py [--bin target/release/memfit] [--n 10] [--seed 0] [--only FAMILY,...]

Stdlib only. Every trial runs in a temporary directory of its own and checks what the issue asks:
the exit code, what is left on disk, the loss curve after a resume against an uninterrupted run,
and (for the guarded shapes) the peak against the budget (each child's ru_maxrss from wait4).
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

GiB = 1 << 30
MiB = 1 << 20


class Memfit:
    def __init__(self, binary):
        self.bin = os.path.abspath(binary)

    def run(self, *args, timeout=300, **kw):
        """(exit code, stdout, stderr, peak RSS bytes) of `memfit ARGS`."""
        return run_measured([self.bin, *map(str, args)], timeout=timeout, **kw)

    def popen(self, *args, **kw):
        return subprocess.Popen([self.bin, *map(str, args)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, **kw)


def run_measured(cmd, timeout=300, cwd=None, env=None):
    """Runs `cmd`; its exit code (negative: the signal), output and peak RSS (ru_maxrss)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=env)
    timer = threading.Timer(timeout, p.kill)
    timer.start()
    out, err = p.stdout.read(), p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    timer.cancel()
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, out.decode(errors="replace"), err.decode(errors="replace"), usage.ru_maxrss * 1024


def metrics(run):
    try:
        return {m["step"]: m["loss"] for m in map(json.loads, open(os.path.join(run, "metrics.jsonl")))}
    except OSError:
        return {}


def events(run, kind=None):
    try:
        rows = [json.loads(line) for line in open(os.path.join(run, "events.jsonl"))]
    except OSError:
        return []
    return [e for e in rows if kind is None or e["kind"] == kind]


def last_json(text):
    """The last line of `text` as JSON ({} when it is not)."""
    try:
        return json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}


def same_curve(a, b, tol=1e-6):
    """Every step of `b` in `a` with the same loss (relative), and the same steps."""
    if set(a) != set(b) or not a:
        return False
    return all(abs(a[s] - b[s]) <= tol * max(abs(b[s]), 1e-12) for s in b)


def evaluations_once(run):
    steps = [e["step"] for e in events(run, "eval")]
    return len(steps) == len(set(steps))


class Campaign:
    def __init__(self, memfit, n, seed):
        self.m, self.n, self.rng = memfit, n, random.Random(seed)
        self.tmp = tempfile.mkdtemp(prefix="guard-campaign-")
        self.results = {}
        self.demo = os.path.join(self.tmp, "demo-run")
        # the demo's files (config, tokenizer, data), and the uninterrupted reference curve
        code, _, err, _ = self.m.run("train", "--demo", "classification", "--out", self.demo,
                                     "--max-steps", DEMO_STEPS, "--save-steps", SAVE_STEPS)
        assert code == 0, err
        self.reference = metrics(self.demo)
        self.files = os.path.join(self.demo, "demo")

    def record(self, family, name, ok, detail=""):
        self.results.setdefault(family, []).append((name, bool(ok), detail))
        if ARGS.json:
            print(json.dumps({"family": family, "trial": name, "ok": bool(ok), "detail": detail}), flush=True)

    def fresh(self, name):
        path = os.path.join(self.tmp, name)
        shutil.rmtree(path, ignore_errors=True)
        return path

    def demo_train(self, out, *extra, steps=None):
        return ["train", "--demo", "classification", "--out", out, "--max-steps", steps or DEMO_STEPS,
                "--save-steps", SAVE_STEPS, *extra]

    # --- the numbered cases --------------------------------------------------------------------
    def numbered(self):
        f = self.files
        for stray in ["1000000", "2147483648", "4000000000"]:
            data = os.path.join(self.tmp, f"labels-{stray}.jsonl")
            with open(data, "w") as out:
                for i, label in enumerate(["0", "1", "2", stray]):
                    out.write(json.dumps({"text": f"the food was good {i}", "label": int(label)}) + "\n")
            run = self.fresh("labels-run")
            code, _, err, peak = self.m.run("train", "--task", "classification", "--model",
                                            f"{f}/config.json", "--tokenizer", f"{f}/tokenizer",
                                            "--data", data, "--out", run)
            self.record("numbered", f"1-2 label {stray} (train)",
                        code == 2 and "line 4" in err and not os.path.exists(run), f"exit {code}, {peak / MiB:.0f} MiB")
            store = self.fresh("labels.store")
            code, _, err, _ = self.m.run("data", "prepare", "--task", "classification", "--input", data,
                                         "--tokenizer", f"{f}/tokenizer", "--out", store)
            self.record("numbered", f"1-2 label {stray} (data prepare)",
                        code == 2 and not os.path.exists(store), f"exit {code}")
        # 3: a 50 MB row under a 2 GiB budget is refused unread, well under the budget
        row = os.path.join(self.tmp, "long-row.jsonl")
        with open(row, "w") as out:
            out.write(json.dumps({"text": "word " * (10 * MiB), "label": "a"}) + "\n")
        store = self.fresh("long.store")
        code, _, err, peak = self.m.run("data", "prepare", "--task", "classification", "--input", row,
                                        "--tokenizer", f"{f}/tokenizer", "--out", store,
                                        "--max-row-bytes", "64MiB", "--budget-ram", "2GiB")
        self.record("numbered", "3 a 50 MB row, --budget-ram 2GiB", code == 2 and peak < 2 * GiB,
                    f"exit {code}, peak {peak / MiB:.0f} MiB")
        # 5: a budget past the machine, nothing made
        run = self.fresh("huge-budget")
        code, _, err, _ = self.m.run(*self.demo_train(run, "--budget-ram", "1TiB"))
        self.record("numbered", "5 --budget-ram 1TiB", code == 2 and not os.path.exists(run), f"exit {code}")
        # 7: both resumable optimizer states damaged: exit 2 naming the checkpoints
        run = self.fresh("damaged")
        shutil.copytree(self.demo, run)
        for ckpt in os.listdir(os.path.join(run, "checkpoints")):
            opt = os.path.join(run, "checkpoints", ckpt, "optimizer.safetensors")
            if os.path.exists(opt):
                with open(opt, "r+b") as fh:
                    fh.truncate(16)
        code, _, err, _ = self.m.run("train", "--resume", run)
        self.record("numbered", "7 both optimizer states damaged", code == 2 and "no checkpoint is whole" in err,
                    f"exit {code}")
        # 8: a bit flipped in the newest checkpoint: it is skipped, the run resumes from the previous
        run = self.fresh("flipped")
        code, _, _, _ = self.m.run(*self.demo_train(run, steps=int(DEMO_STEPS) // 2))
        newest = max(os.listdir(os.path.join(run, "checkpoints")), key=lambda c: int(c.split("-")[1]))
        weights = os.path.join(run, "checkpoints", newest, "model.safetensors")
        with open(weights, "r+b") as fh:
            fh.seek(-1, os.SEEK_END)
            last = fh.read(1)
            fh.seek(-1, os.SEEK_END)
            fh.write(bytes([last[0] ^ 1]))
        code, _, err, _ = self.m.run("train", "--resume", run, "--max-steps", DEMO_STEPS, "--allow-config-change")
        skipped = [e for e in events(run, "resume") if e.get("skipped")]
        self.record("numbered", "8 a bit flip in the newest checkpoint", code == 0 and skipped, f"exit {code}")
        # 10: the estimate's overflow is exit 2 naming the flag
        code, _, err, _ = self.m.run("estimate", "--model", "t5-small", "--seq", "18446744073709551615")
        self.record("numbered", "10 estimate --seq 2^64-1", code == 2 and "--seq" in err, f"exit {code}")

    # --- 4 and the guarded runs: memfit under memfit run ---------------------------------------
    def under_run(self):
        """Case 4: a memfit train under `memfit run --budget` plans for the budget it is handed
        (MEMFIT_RUN_BUDGET_BYTES): it finishes, stops resumable with a checkpoint, or refuses to start
        (nothing fits, nothing made), and the job's peak stays within the budget."""
        budget = 64 * MiB
        for i in range(self.n):
            run = self.fresh(f"under-run-{i}")
            code, out, err, _ = self.m.run("run", "--budget", "64MiB", "--json", "--", self.m.bin, "train",
                                           "--out", run, "--max-steps", 30, "--batch", 256)
            summary = last_json(out)
            child = summary.get("exit_code")
            ckpts = os.path.join(run, "checkpoints")
            ok = (child == 0 or (child == 75 and os.listdir(ckpts))
                  or (child == 3 and not os.path.exists(run)))
            peak = summary.get("peak_job_bytes") or 0
            self.record("memfit train under memfit run --budget 64MiB", f"run {i}",
                        ok and 0 < peak <= budget * 1.03, f"exit {child}, peak {peak / MiB:.0f} MiB")

    # --- kills and signals at random moments ---------------------------------------------------
    def interrupted(self, family, sig):
        for i in range(self.n):
            run = self.fresh(f"{family}-{i}")
            p = self.m.popen(*self.demo_train(run))
            time.sleep(self.rng.uniform(0.05, DEMO_SECONDS * 0.9))
            p.send_signal(sig)
            _, err = p.communicate()
            stopped = p.returncode
            code, _, err2, _ = self.m.run("train", "--resume", run) if os.path.exists(os.path.join(run, "config.toml")) \
                else self.m.run(*self.demo_train(run))
            ok = code == 0 and same_curve(metrics(run), self.reference) and evaluations_once(run)
            self.record(family, f"trial {i}", ok, f"stopped {stopped}, resumed {code}")

    # --- racing starts -------------------------------------------------------------------------
    def racing(self):
        for i in range(self.n):
            run = self.fresh(f"race-{i}")
            racers = [self.m.popen(*self.demo_train(run)) for _ in range(4)]
            codes = [r.wait() for r in racers]
            owners = codes.count(0)
            ok = owners == 1 and same_curve(metrics(run), self.reference) and evaluations_once(run)
            self.record("racing starts (4 at once)", f"trial {i}", ok, f"exits {codes}")

    # --- guarded process shapes: memfit run over a growing child ------------------------------
    def shapes(self):
        grow = ("import time\nchunks = []\nfor _ in range(400):\n"
                "    chunks.append(bytearray({step}))\n    time.sleep(0.01)\n")
        shapes = {"one process": grow,
                  "parent + child": "import subprocess, sys\nsubprocess.run([sys.executable, '-c', %r])\n" % grow}
        for name, code_text in shapes.items():
            for i in range(max(1, self.n // 2)):
                step = 4 * MiB
                code, out, err, _ = run_measured([self.m.bin, "run", "--budget", "256MiB", "--grace", "1s", "--json", "--",
                                                  sys.executable, "-c", code_text.format(step=step)], timeout=120)
                peak = last_json(out).get("peak_job_bytes") or 0
                ok = code != 0 and 0 < peak <= 256 * MiB * 1.03
                self.record(f"guarded shape: {name}", f"trial {i}", ok, f"exit {code}, peak {peak / MiB:.0f} MiB")

    def report(self):
        print(f"\n{'family':<45} {'k/n':>7}")
        for family, trials in self.results.items():
            k = sum(ok for _, ok, _ in trials)
            print(f"{family:<45} {k:>3}/{len(trials):<3}")
            for name, ok, detail in trials:
                if not ok:
                    print(f"    FAILED {name}: {detail}")
        shutil.rmtree(self.tmp, ignore_errors=True)
        return all(ok for trials in self.results.values() for _, ok, _ in trials)


DEMO_STEPS, SAVE_STEPS, DEMO_SECONDS = "400", "40", 2.0
FAMILIES = ["numbered", "under_run", "sigkill", "sigterm", "sigint", "racing", "shapes"]

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default="target/release/memfit")
    p.add_argument("--n", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default=",".join(FAMILIES))
    p.add_argument("--json", action="store_true")
    ARGS = p.parse_args()
    c = Campaign(Memfit(ARGS.bin), ARGS.n, ARGS.seed)
    start = time.time()
    for family in ARGS.only.split(","):
        if family == "sigkill":
            c.interrupted("SIGKILL at a random moment, then --resume", signal.SIGKILL)
        elif family == "sigterm":
            c.interrupted("SIGTERM at a random moment, then --resume", signal.SIGTERM)
        elif family == "sigint":
            c.interrupted("SIGINT at a random moment, then --resume", signal.SIGINT)
        else:
            getattr(c, family)()
    print(f"({time.time() - start:.0f} s, n={ARGS.n}, seed {ARGS.seed}, {os.path.abspath(ARGS.bin)})")
    sys.exit(0 if c.report() else 1)
