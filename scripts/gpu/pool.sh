#!/usr/bin/env bash
# The caching allocator's pool under step lengths that vary, and QLoRA through bitsandbytes (issue 31),
# measured in one call on a GPU machine with torch, transformers and PEFT (no Rust, no network): the
# runs of ROWS (default scripts/gpu/pool_runs.csv; scripts/gpu/qlora_runs.csv for QLoRA) through
# scripts/measure_gpu_memory.py, most important first, each in a fresh process, none started after
# POOL_SECONDS (default 360). QLoRA needs bitsandbytes: where the machine has none, the wheel that
# scripts/gpu/wheels.sh put in .gpu-wheels/ is installed from there (carry it). Writes into $OUT:
#   pool.jsonl      a line per run: its peaks, and per step [length, peak allocated MiB, reserved MiB,
#                   segments, inactive split MiB] (per_step)
#   pool_runs.csv   (or qlora_runs.csv) the runs with the peak reserved filled in (metric RES), the
#                   GPU and the versions
#   pool-traces.tar the allocator's events of the traced runs (trace_steps), for
#                   `zcat traces/pool-2.trace.gz | cargo run --release -p memfit-plan --example replay_allocator`
#   pool.log        everything printed
# On the GPU machine, from the repository root (7 minutes):  bash scripts/gpu/pool.sh
#   QLoRA, with .gpu-wheels/ (scripts/gpu/wheels.sh) beside it:  ROWS=scripts/gpu/qlora_runs.csv bash scripts/gpu/pool.sh
# POOL_DEVICE=cpu runs the same rows at tiny sizes on the CPU (a dry run of the script: no figures).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/memfit-pool}
PY=${PY:-python3}
DEVICE=${POOL_DEVICE:-cuda}
mkdir -p "$OUT/traces"
rows=${ROWS:-scripts/gpu/pool_runs.csv}
written="$OUT/$(basename "$rows")"
if grep -q ',nf4\|,fp4' "$rows" && ! "$PY" -c 'import bitsandbytes' 2>/dev/null; then
    "$PY" -m pip install --quiet --no-deps --no-index .gpu-wheels/bitsandbytes-*.whl 2>&1 | tail -3
fi
if [ "$DEVICE" = cpu ]; then
    # A two-block Qwen (v1) of the same form, 64 tokens, 3 steps: the rows' code paths, not their sizes.
    "$PY" - "$OUT" "$rows" <<'EOF'
import csv, json, sys
out = sys.argv[1]
fields = json.load(open("validation/models/qwen-1_8b.json"))
fields.update(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_hidden_layers=2, vocab_size=1000)
json.dump(fields, open(f"{out}/qwen-tiny.json", "w"))
with open(sys.argv[2], newline="") as f:
    reader = csv.DictReader(f)
    rows = list(reader)
for row in rows:
    row.update(model=f"{out}/qwen-tiny.json", seq="64", steps="3")
with open(f"{out}/runs_cpu.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=reader.fieldnames, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
EOF
    rows="$OUT/runs_cpu.csv"
fi
"$PY" -c 'import torch, transformers, peft; print("torch", torch.__version__, "transformers", transformers.__version__, "peft", peft.__version__)' 2>&1 | tee "$OUT/pool.log"
"$PY" scripts/measure_gpu_memory.py --rows "$rows" --write "$written" --device "$DEVICE" \
    --trace-dir "$OUT/traces" --budget "${POOL_SECONDS:-360}" --timeout 240 \
    2>>"$OUT/pool.log" | tee "$OUT/pool.jsonl"
status=${PIPESTATUS[0]}
tar -C "$OUT" -cf "$OUT/pool-traces.tar" traces && rm -rf "$OUT/traces"
echo "measure_gpu_memory.py exit $status; $(wc -l < "$OUT/pool.jsonl") runs measured" | tee -a "$OUT/pool.log"
exit "$status"
