#!/usr/bin/env bash
# Issue 29, "peaks are caught", measured on the PyTorch baseline (docs/guard.md, "Peaks against an
# independent poll"):
#  1. `memfit run` on bench_t5.py (tiny shape, batch 16), once with glibc's mmap threshold pinned as
#     `memfit calibrate`'s profiles run it and once as is; memfit's recorded peak set beside an
#     independent 20 ms poll of the job's RssAnon + RssShmem + VmSwap (scripts/peak_poll.py; 3%), and
#     for information the kernel's VmHWM less the RssFile of the poll nearest it;
#  2. `memfit calibrate --batches 1,2,4 --at 16` on the same command; its batch-16 prediction set
#     beside the independent figures of the pinned batch-16 run.
# Prints a Markdown table; exits 1 when a figure is outside its tolerance (3%, 10%).
#
# Usage: PY=/path/to/venv/bin/python scripts/check_peaks.sh
#   PY      python with requirements.txt of the baseline installed (default /work/venv-torch/bin/python)
#   BENCH   the baseline's folder (default ../shared/bench/pytorch from the repository root)
#   MEMFIT  the memfit binary (default target/release/memfit; `cargo build --release -p memfit`)
#   STEPS   optimizer steps per run (default 5; bench_t5.py warms up for 3)
#   OUT     folder for the raw JSON (default: a new temporary folder, kept)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-/work/venv-torch/bin/python}
BENCH=${BENCH:-../shared/bench/pytorch}
MEMFIT=${MEMFIT:-target/release/memfit}
STEPS=${STEPS:-5}
OUT=${OUT:-$(mktemp -d -t memfit-peaks-XXXXXX)}
mkdir -p "$OUT"
PIN=MALLOC_MMAP_THRESHOLD_=131072
TINY=(--vocab 8000 --d-model 256 --d-ff 1024 --layers 4 --heads 4 --seq 128 --device cpu
      --data-dir "$OUT/data")
echo "raw figures in $OUT" >&2

# The first run writes the baseline's parquet file: keep that out of the measured runs.
"$PY" "$BENCH/bench_t5.py" "${TINY[@]}" --batch 1 --steps 4 > /dev/null 2>"$OUT/warmup.err"

measure() { # NAME ENV... -- measured under memfit run and the independent poll at once
    local name=$1; shift
    python3 scripts/peak_poll.py --interval-ms 20 -- "$MEMFIT" run --json -- env "$@" \
        "$PY" "$BENCH/bench_t5.py" "${TINY[@]}" --batch 16 --steps "$STEPS" \
        > "$OUT/$name.json" 2>"$OUT/$name.err"
}
measure batch16-pinned "$PIN"
measure batch16-unpinned
"$MEMFIT" calibrate --batches 1,2,4 --at 16 --steps "$STEPS" --json --out "$OUT" -- \
    "$PY" "$BENCH/bench_t5.py" "${TINY[@]}" --batch '{batch}' --steps '{steps}' \
    > "$OUT/calibrate.json" 2>"$OUT/calibrate.err"

python3 - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
mib = lambda b: b / 2**20
fails = 0
def row(what, got, ref, tol=None):
    global fails
    off = (got - ref) / ref
    ok = tol is None or abs(off) <= tol
    fails += not ok
    verdict = "(information)" if tol is None else f"{'ok' if ok else 'MISS'} (±{tol*100:.0f}%)"
    print(f"| {what} | {mib(got):.0f} | {mib(ref):.0f} | {off*100:+.1f}% | {verdict} |")
print("| figure | memfit MiB | independent MiB | difference | within |")
print("|---|---|---|---|---|")
runs = {}
for name in ("batch16-pinned", "batch16-unpinned"):
    poll = json.load(open(f"{out}/{name}.json"))
    memfit = json.loads(poll["stdout"].strip().splitlines()[-1])
    a = memfit["attempts"][0]
    runs[name] = poll
    src = ", ".join(f"{k.removesuffix('_bytes')} {mib(v):.0f}" for k, v in a["peak_sources"].items() if v is not None)
    row(f"`memfit run` {name}: recorded peak ({src}) vs 20 ms poll", a["peak_job_bytes"], poll["poll_peak_bytes"], 0.03)
    row(f"`memfit run` {name}: recorded peak vs VmHWM − RssFile at the largest RSS polled", a["peak_job_bytes"], poll["hwm_minus_file_bytes"])
cal = json.load(open(f"{out}/calibrate.json"))
pts = ", ".join(f"{p['batch']}: {mib(p['peak_rss_bytes']):.0f}" for p in cal["points"])
pinned = runs["batch16-pinned"]
row(f"`memfit calibrate` from batches {pts} MiB: batch 16 predicted vs the pinned run's 20 ms poll", cal["at"]["peak_rss_bytes"], pinned["poll_peak_bytes"], 0.10)
sys.exit(1 if fails else 0)
EOF
