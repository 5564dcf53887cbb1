#!/usr/bin/env bash
# memfit train on a GPU, checked in one call of under 9 minutes on a machine with PyTorch,
# transformers and PEFT but no Rust and no network (docs/gpu.md). It takes the binary that
# scripts/gpu/build.sh packed into .gpu/ and writes into $OUT gpu.md (the tables, scripts/gpu/tables.py),
# accept.log (everything printed) and results.tar.gz, which holds:
#   preflight.jsonl  four steps of the tiny T5 on the device (or, if that fails, why: accept.log), then
#                    the same in a second process, its kernels from the disk cache
#   parity.jsonl  the same 20 steps on the GPU (parity.jsonl) and on the CPU (parity-cpu.jsonl),
#                 fp32 and bf16, three families
#   speed.jsonl   memfit and PyTorch (eager, then torch.compile's TORCH_COMPILE modes) on the same card,
#                 bf16, the issue's three shapes (the LoRA base in bf16 on both sides)
#   matmul.jsonl, matmul-torch.jsonl  each matrix product of those steps timed alone: memfit bench matmul,
#                 then scripts/gpu/matmul_torch.py (torch.matmul) on the same list
#   speed-fusion.jsonl  the same shapes with the build that has burn's kernel fusion (.gpu/memfit-fusion.xz)
#   parity-fusion.jsonl that build's bf16 parity runs (paired with parity-cpu.jsonl)
#   memory.jsonl  memfit's pool and NVML peaks, three sizes per family
#   resume.jsonl  a run killed by SIGTERM and resumed, beside the same run uninterrupted
#   oom.jsonl     a run whose micro-batch does not fit the card: its real CUDA out-of-memory
#                 errors caught, the micro-batch halved until a step fits, the run finished
#   profile-*-N.log cubecl's per-kernel times of each speed shape over N steps, a line per launch (where the
#                 GPU time goes: the longer run less the shorter, tables.py)
#   accept.log, check.json (memfit check --json)
# The sections run in order of importance inside ACCEPT_SECONDS (default 500): one that would start
# too late is skipped and says so, and the tables are written from whatever ran. SECTIONS (default
# "parity speed torch matmul fusion oom resume memory profile") picks some for a short rerun; PARITY_PRECISIONS
# (default "fp32 bf16") the parity rows'.
# MEMFIT_ACCEPT_DEVICE=cpu runs the same steps, at tiny sizes, on the CPU (a dry run of the script
# itself); MEMFIT_ACCEPT_DEVICE=wgpu with a memfit built with `--features wgpu` runs them on cubecl's
# kernels through wgpu (Mesa's software renderer here): the GPU code path rehearsed without a card.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/memfit-accept}
mkdir -p "$OUT"
# Everything is written in RES and packed into $OUT/results.tar.gz after each section (the device
# tool brings back at most 8 files from $OUT): a run cut short still brings back what it measured.
RES=$(mktemp -d)
DEVICE=${MEMFIT_ACCEPT_DEVICE:-cuda}
PY=${PY:-python3}
BIN=${MEMFIT_BIN:-/tmp/memfit}
BASE=.gpu/pytorch
# The issue's shapes (bf16 speed beside PyTorch) and the memory table's; a CPU dry run takes tiny ones.
SPEED_T5="--model t5-small --batch 32 --seq 128"
TORCH_T5="--vocab 32128 --d-model 512 --d-ff 2048 --layers 6 --heads 8 --batch 32 --seq 128"
SPEED_BERT="--model bert-base-chinese --batch 32 --seq 128"
TORCH_BERT="--hidden 768 --layers 12 --heads 12 --batch 32 --seq 128"
SPEED_LORA="--model qwen2.5-0.5b --method lora --lora-r 16 --base-precision bf16 --batch 8 --seq 512"
TORCH_LORA="--batch 8 --seq 512"
MEMORY_RUNS=("--model tiny --batch 8 --seq 128" "--model tiny --batch 32 --seq 128"
    "--model t5-small --batch 16 --seq 256"
    "--model bert-small --batch 16 --seq 128" "--model bert-small --batch 64 --seq 128"
    "--model bert-base-chinese --batch 16 --seq 256"
    "--model qwen2-small --method lora --batch 4 --seq 256"
    "--model qwen2-small --method lora --batch 8 --seq 512"
    "--model qwen2.5-0.5b --method lora --batch 4 --seq 512")
STEPS="--steps 12"
# torch.compile's modes timed beside eager (the table takes the fastest): reduce-overhead replays CUDA
# graphs, as memfit's --cuda-graph is to; max-autotune's compile takes minutes, past this script's budget.
TORCH_COMPILE=${TORCH_COMPILE:-reduce-overhead}
# The speed shapes' matrix products, timed alone (`memfit bench matmul`, then torch.matmul on the same list).
MATMUL_RUNS=("--model t5-small --batch 32 --seq 128" "--model bert-base-chinese --batch 32 --seq 128"
    "--model qwen2.5-0.5b --method lora --lora-r 16 --batch 8 --seq 512")
MATMUL_ITERS=20
# The out-of-memory run: a 2-layer Llama (chat-tiny's words) on rows of about 1,900 tokens at micro-batch
# 2048, which the host plan allows (its CPU attention streams; --budget-ram 95% of the available memory,
# above what the run uses on the host, and never past the machine's, which memfit refuses): on the device
# one block's attention scores alone are 2048 x 4 heads x 2048^2 x 4 B = 137 GB, past an H200, so each
# halving until a step fits is one caught CUDA out-of-memory error. memfit's GPU plan sees that too and
# would refuse to start (an H100, 2026-11-27: "nothing fits ... 366 GiB"): a --budget-gpu past the card
# makes it start there, as a wrong estimate would.
OOM_WORDS=950; OOM_SEQ=2048; OOM_BATCH=2048; OOM_ROWS=2048; OOM_GPU_BUDGET="--budget-gpu 4096GiB"
if [ "$DEVICE" = cpu ] || [ "$DEVICE" = wgpu ]; then
    OOM_WORDS=20; OOM_SEQ=64; OOM_BATCH=4; OOM_ROWS=16; OOM_GPU_BUDGET=""
    SPEED_T5="--model tiny --batch 2 --seq 16"; TORCH_T5="--batch 2 --seq 16"
    SPEED_BERT="--model bert-small --batch 2 --seq 16"; TORCH_BERT="--batch 2 --seq 16"
    SPEED_LORA="--model qwen2-small --method lora --base-precision bf16 --batch 1 --seq 16"; TORCH_LORA="--batch 1 --seq 16 --hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2 --vocab 1000"
    MEMORY_RUNS=("--model tiny --batch 2 --seq 16" "--model bert-small --batch 2 --seq 16")
    STEPS="--steps 5"
    MATMUL_RUNS=("--model tiny --batch 2 --seq 16" "--model bert-small --batch 2 --seq 16"
        "--model qwen2-small --method lora --batch 1 --seq 16")
    MATMUL_ITERS=3
fi
# On wgpu's software adapter a buffer past 1 GiB is refused: 64 rows of ~1,000 tokens give 1 GiB of one
# block's attention scores, so the out-of-memory run halves once there.
[ "$DEVICE" = wgpu ] && { OOM_WORDS=450; OOM_SEQ=1024; OOM_BATCH=64; OOM_ROWS=64; }
# Precisions: wgpu's adapters here have no bf16, and PyTorch has no wgpu device (no baseline rows).
PARITY_PRECISIONS=${PARITY_PRECISIONS:-fp32 bf16}; SPEED_PRECISION=bf16
[ "$DEVICE" = wgpu ] && { PARITY_PRECISIONS=fp32; SPEED_PRECISION=fp32; }
LOG="$RES/accept.log"
snapshot() {
    tar -C "$RES" -czf "$OUT/results.tar.gz.tmp" . && mv "$OUT/results.tar.gz.tmp" "$OUT/results.tar.gz"
    cp "$LOG" "$OUT/accept.log"
}
: > "$LOG"
DEADLINE=${ACCEPT_SECONDS:-500}
SECTIONS=" ${SECTIONS:-parity speed torch matmul fusion oom resume memory profile} "
# Whether section $1 was asked for.
want() { [[ "$SECTIONS" == *" $1 "* ]]; }
log() { echo "[$(date +%T) +${SECONDS}s] $*" | tee -a "$LOG" >&2; }
# Whether a section expected to take about $1 seconds still fits before the deadline.
fits() {
    if [ $((SECONDS + $1)) -le "$DEADLINE" ]; then return 0; fi
    log "skipped, out of time ($((DEADLINE - SECONDS)) s left, about $1 s needed): $2"
    return 1
}
# A command's time limit: STEP_TIMEOUT, or what is left before the deadline.
limit() {
    local left=$((DEADLINE - SECONDS - 5)) cap=${STEP_TIMEOUT:-150}
    [ "$left" -lt 10 ] && left=10
    [ "$left" -lt "$cap" ] && echo "$left" || echo "$cap"
}

if [ ! -x "$BIN" ]; then
    xz -dc .gpu/memfit.xz > "$BIN" && chmod +x "$BIN" || { log "no .gpu/memfit.xz: run scripts/gpu/build.sh"; exit 2; }
fi

# Peak device memory in use while a command runs (nvidia-smi every 50 ms, less what was in use
# before), appended to the command's JSON line: the same measure for memfit and PyTorch.
measured() {
    local out=$1; shift
    local poll="$RES/.poll" idle=0
    if command -v nvidia-smi >/dev/null && [ "$DEVICE" != cpu ]; then
        idle=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | head -1)
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 50 > "$poll" &
    else
        : > "$poll"; sleep 0 &
    fi
    local poller=$! start=$SECONDS
    local line err="$RES/.stderr"
    line=$(timeout "$(limit)" "$@" 2>"$err" | tail -1)
    local rc=$?
    kill $poller 2>/dev/null; wait $poller 2>/dev/null
    cat "$err" >> "$LOG"
    local peak late
    peak=$(sort -n "$poll" | tail -1)
    # the peak over the run's second half: past the first step's kernel compiles and autotune
    late=$(tail -n $(( $(wc -l < "$poll") / 2 + 1 )) "$poll" | sort -n | tail -1)
    record "$out" "$line" "${peak:-0}" "$idle" "$rc" "$((SECONDS - start))" "$*" "$(tail -1 "$err")" "${late:-0}"
    log "rc=$rc ($((SECONDS - start)) s): $*"
}
# The parity runs of each family (PARITY, below) at precisions $3, trained on the device by memfit
# binary $2, their records into $1; with $4 = no-dropout, only the runs with dropout off (a fusion
# build draws burn's masks, not the CPU's).
parity_rows() {
    for family in "${PARITY[@]}"; do
        [ "${4:-}" = no-dropout ] && [[ $family == *"--dropout 0."* ]] && continue
        for precision in $3; do
            # shellcheck disable=SC2086
            measured "$1" "$2" bench train ${family#*|} --steps 20 --precision $precision \
                --device "$DEVICE" --json
        done
    done
}
# The three speed shapes trained by memfit binary $2, their records into $1.
speed_rows() {
    for shape in "$SPEED_T5" "$SPEED_BERT" "$SPEED_LORA"; do
        # shellcheck disable=SC2086
        measured "$1" "$2" bench train $shape --precision $SPEED_PRECISION --device "$DEVICE" $STEPS --json
    done
}
# One JSON line: the command's own last line, with the NVML peak, exit status, wall time and command.
record() {
    local out=$1; shift
    $PY - "$@" >> "$out" <<'PYEOF'
import json, sys
line, peak, idle, rc, secs, cmd = sys.argv[1:7]
stderr = sys.argv[7] if len(sys.argv) > 7 else ""
late = int(sys.argv[8]) if len(sys.argv) > 8 else 0
try:
    rec = json.loads(line)
except ValueError:
    rec = {"error": (stderr or line)[-500:]}
rec.update(nvml_peak_mib=int(peak) - int(idle), exit=int(rc), wall_s=int(secs), command=cmd)
if late:
    rec.update(nvml_late_peak_mib=late - int(idle))
print(json.dumps(rec))
PYEOF
}

log "card: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo none)"
"$BIN" check --json > "$RES/check.json" 2>>"$LOG"
for f in parity parity-cpu parity-fusion speed speed-fusion matmul matmul-torch memory resume oom preflight; do : > "$RES/$f.jsonl"; done

# 0. Preflight: four steps of the tiny T5 on the device. If the device cannot train, say why and stop
#    here, so a failed start costs a minute of the machine, not nine.
PREFLIGHT=(bench train --model tiny --batch 8 --seq 64 --steps 4 --device "$DEVICE" --json)
measured "$RES/preflight.jsonl" "$BIN" "${PREFLIGHT[@]}"
if ! grep -q '"losses"' "$RES/preflight.jsonl" && [ "$DEVICE" != cpu ]; then
    # memfit's own GPU kernels (kernels/device) first meet NVRTC here: without them (burn's
    # composite ops) the rest of the script still measures, and the log keeps why they failed.
    log "preflight failed with memfit's GPU kernels: $(tail -c 400 "$RES/preflight.jsonl"); again without them"
    export MEMFIT_GPU_KERNELS=off
    tail -c 400 "$RES/preflight.jsonl" > "$RES/gpu-kernels-off"
    : > "$RES/preflight.jsonl"
    measured "$RES/preflight.jsonl" "$BIN" "${PREFLIGHT[@]}"
fi
if ! grep -q '"losses"' "$RES/preflight.jsonl"; then
    log "preflight failed; what the machine has:"
    {
        "$BIN" check 2>&1
        ldconfig -p | grep -E "libcuda|libnvrtc" ; ls -d /usr/local/cuda* 2>&1
        $PY -c "import nvidia; print(list(nvidia.__path__))" 2>&1
        echo "CUDA_PATH=${CUDA_PATH:-} LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
        RUST_BACKTRACE=1 "$BIN" bench train --model tiny --batch 2 --seq 16 --steps 4 --device "$DEVICE" 2>&1 | tail -40
    } >> "$LOG" 2>&1
    $PY scripts/gpu/tables.py "$RES" > "$OUT/gpu.md" 2>>"$LOG"
    snapshot
    exit 3
fi
# The same again in a new process: its kernels come from cubecl's cache on disk (kernel_cache.rs).
measured "$RES/preflight.jsonl" "$BIN" "${PREFLIGHT[@]}"

# 1. Parity: 20 steps on the device and on the CPU from the same weights and tokens, dropout off,
#    and BERT with dropout on (memfit's dropout kernel draws the CPU's masks: the same steps). The
#    CPU runs go on in the background on a few cores while the device runs.
PARITY=("t5|--model tiny --batch 8 --seq 64 --dropout 0"
        "bert|--model bert-small --batch 8 --seq 64 --dropout 0"
        "lora|--model qwen2-small --method lora --batch 4 --seq 64 --dropout 0 --lora-dropout 0"
        "bert-dropout|--model bert-small --batch 8 --seq 64 --dropout 0.1")
want parity && (
    for family in "${PARITY[@]}"; do
        for precision in $PARITY_PRECISIONS; do
            # shellcheck disable=SC2086
            line=$(timeout 300 "$BIN" bench train ${family#*|} --steps 20 --precision $precision \
                --device cpu --threads 4 --json 2>>"$LOG" | tail -1)
            record "$RES/parity-cpu.jsonl" "$line" 0 0 $? 0 "cpu ${family#*|} $precision"
        done
    done
) &
if want parity && fits 60 "parity on the device"; then
    parity_rows "$RES/parity.jsonl" "$BIN" "$PARITY_PRECISIONS"
fi

snapshot

# 2. Speed and memory beside PyTorch on the same card, bf16 (the issue's three shapes).
if want speed && fits 90 "speed"; then
    speed_rows "$RES/speed.jsonl" "$BIN"
fi
if want torch && fits 80 "PyTorch's speed"; then
    if [ "$DEVICE" != wgpu ] && $PY -c "import torch, transformers, peft" 2>/dev/null; then
        # shellcheck disable=SC2086
        {
            for mode in none $TORCH_COMPILE; do
                [ "$mode" != none ] && ! fits 60 "PyTorch compiled ($mode)" && break
                measured "$RES/speed.jsonl" $PY $BASE/bench_t5.py $TORCH_T5 --bf16 --device "$DEVICE" --data random $STEPS --compile $mode
                measured "$RES/speed.jsonl" $PY $BASE/bench_bert_cls.py $TORCH_BERT --bf16 --device "$DEVICE" --data random $STEPS --compile $mode
                measured "$RES/speed.jsonl" $PY $BASE/bench_causal_lora.py $TORCH_LORA --base-dtype bf16 --bf16 --device "$DEVICE" $STEPS --compile $mode
            done
        }
    else
        log "PyTorch, transformers or PEFT missing (or no such device for PyTorch): no baseline rows"
    fi
fi

snapshot

# 2a. Each matrix product of the speed shapes' steps alone: memfit's (cubecl's matmul) and torch.matmul's
#     (cuBLAS) on the same shapes, layouts and card: whether cubecl's GEMMs hold memfit back.
if want matmul && fits 60 "matmul"; then
    for run in "${MATMUL_RUNS[@]}"; do
        fits 20 "matmul: $run" || break
        # shellcheck disable=SC2086
        timeout "$(limit)" "$BIN" bench matmul $run --precision $SPEED_PRECISION --device "$DEVICE" \
            --iters $MATMUL_ITERS --json >> "$RES/matmul.jsonl" 2>>"$LOG" || log "matmul $run: exit $?"
    done
    if [ "$DEVICE" != wgpu ] && $PY -c "import torch" 2>/dev/null; then
        timeout "$(limit)" $PY scripts/gpu/matmul_torch.py "$RES/matmul.jsonl" --device "$DEVICE" \
            --iters $MATMUL_ITERS > "$RES/matmul-torch.jsonl" 2>>"$LOG" || log "torch.matmul: exit $?"
    fi
    log "matmul: $(wc -l < "$RES/matmul.jsonl") products timed, $(wc -l < "$RES/matmul-torch.jsonl") by torch"
fi

snapshot

# 2b. burn's kernel fusion (docs/gpu.md, Build: fewer launches; right on wgpu since passes keep their
#     stream): its bf16 parity against the CPU runs of section 1, then the speed shapes, to decide
#     whether the packed binary takes it.
if want fusion && [ "$DEVICE" = cuda ] && [ -f .gpu/memfit-fusion.xz ] && fits 140 "fusion"; then
    xz -dc .gpu/memfit-fusion.xz > /tmp/memfit-fusion && chmod +x /tmp/memfit-fusion
    parity_rows "$RES/parity-fusion.jsonl" /tmp/memfit-fusion bf16 no-dropout
    speed_rows "$RES/speed-fusion.jsonl" /tmp/memfit-fusion
fi

snapshot

# 3. A micro-batch that does not fit the card: CUDA's out-of-memory errors are caught, the last
# completed step checkpointed, the micro-batch halved (effective batch kept) until a step fits.
if want oom && fits 60 "out of memory"; then
    oom=$(mktemp -d)
    $PY - "$oom" "$OOM_WORDS" "$OOM_SEQ" "$OOM_ROWS" <<'PYEOF'
import json, random, sys
out, words, seq, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
config = json.load(open("examples/chat-tiny/config.json"))
config.update(max_position_embeddings=seq, hidden_size=64, intermediate_size=128)
json.dump(config, open(f"{out}/config.json", "w"))
vocab, r = "moon red dog tree sun cat blue green".split(), random.Random(0)
with open(f"{out}/long.jsonl", "w") as f:
    for _ in range(rows):
        text = [r.choice(vocab) for _ in range(words)]
        f.write(json.dumps({"instruction": " ".join(text), "output": " ".join(text[::-1])}) + "\n")
PYEOF
    # shellcheck disable=SC2086
    timeout "$(limit)" "$BIN" train --task causal-lm --model "$oom/config.json" \
        --tokenizer examples/chat-tiny/tokenizer --data "$oom/long.jsonl" --seq "$OOM_SEQ" \
        --batch "$OOM_BATCH" --max-steps 1 --budget-ram 95% $OOM_GPU_BUDGET --device "$DEVICE" --out "$oom/run" \
        --json > "$oom/run.json" 2>>"$LOG"
    ran=$?
    $PY - "$oom/run" "$ran" "$OOM_BATCH" >> "$RES/oom.jsonl" <<'PYEOF'
import json, sys
run, code, asked = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
try:
    events = [json.loads(line) for line in open(f"{run}/events.jsonl")]
except OSError:
    events = []
print(json.dumps({"exit": code, "asked_micro_batch": asked,
                  "downgrades": [{k: e.get(k) for k in ("step", "reason", "old_micro_batch",
                                                       "new_micro_batch", "message")}
                                 for e in events if e["kind"] == "downgrade"],
                  "stop": next((e for e in events if e["kind"] == "stop"), None),
                  "checkpoints": [e["step"] for e in events if e["kind"] == "checkpoint"]}))
PYEOF
    log "out of memory: $(tail -1 "$RES/oom.jsonl" | cut -c1-300)"
fi

snapshot

# 4. A run stopped by SIGTERM and resumed, beside the same run uninterrupted (same data order,
# same losses to 1e-4 relative).
if want resume && fits 60 "kill and resume"; then
    runs=$(mktemp -d)
    timeout "$(limit)" "$BIN" train --demo classification --device "$DEVICE" --out "$runs/whole" \
        --max-steps 120 --save-steps 40 --json > "$runs/whole.json" 2>>"$LOG"
    "$BIN" train --demo classification --device "$DEVICE" --out "$runs/cut" --max-steps 120 \
        --save-steps 40 --json > /dev/null 2>>"$LOG" &
    pid=$!
    for _ in $(seq 1 600); do
        [ -n "$(ls -d "$runs"/cut/checkpoints/step-* 2>/dev/null)" ] && break
        sleep 0.1
    done
    kill -TERM $pid; wait $pid; stopped=$?
    timeout "$(limit)" "$BIN" train --resume "$runs/cut" --device "$DEVICE" --json > "$runs/cut.json" 2>>"$LOG"
    resumed=$?
    $PY - "$runs" "$stopped" "$resumed" >> "$RES/resume.jsonl" <<'PYEOF'
import json, sys
runs, stopped, resumed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def losses(run):
    out = {}
    try:
        for line in open(f"{runs}/{run}/metrics.jsonl"):
            m = json.loads(line)
            out[m["step"]] = m["loss"]
    except OSError:
        pass
    return out
whole, cut = losses("whole"), losses("cut")
worst = max((abs(cut[s] - whole[s]) / max(abs(whole[s]), 1e-12) for s in whole if s in cut), default=None)
print(json.dumps({"stopped_exit": stopped, "resumed_exit": resumed, "steps_whole": len(whole),
                  "steps_resumed": len(cut), "worst_rel_loss_diff": worst}))
PYEOF
    log "resume: $(tail -1 "$RES/resume.jsonl")"
fi

snapshot

# 5. Memory at three sizes per family (fp32, 6 steps).
want memory && for run in "${MEMORY_RUNS[@]}"; do
    fits 20 "memory: $run" || break
    # shellcheck disable=SC2086
    measured "$RES/memory.jsonl" "$BIN" bench train $run --steps 6 --device "$DEVICE" --json
done

snapshot

# 6. Where the GPU time goes: cubecl's own profile of each speed shape (level basic: every kernel timed
# on the device with a sync after it, so the run is slower; the shares are the figure), written by
# cubecl from a cubecl.toml in the directory the runs start in. Steady state by difference: after an
# unprofiled run that fills the kernel and autotune caches, a PROFILE_SHORT- and a PROFILE_LONG-step
# run (bench train takes more than its 3 warm-up steps); tables.py subtracts the shorter's per-kernel
# totals from the longer's, so what both pay once (process start, compiles, autotune, the first steps)
# cancels and the steps between them remain.
PROFILE_SHORT=4; PROFILE_LONG=9
prof=$(mktemp -d)
want profile && for shape in "$SPEED_T5" "$SPEED_BERT" "$SPEED_LORA"; do
    name=$(echo "$shape" | awk '{print $2}')
    fits 45 "profile of $name" || break
    rm -f "$prof/cubecl.toml"
    # shellcheck disable=SC2086
    (cd "$prof" && timeout "$(limit)" "$BIN" bench train $shape --precision $SPEED_PRECISION --device "$DEVICE" \
        --steps $PROFILE_SHORT --json > /dev/null 2>>"$LOG") || log "profile warm-up of $name: exit $?"
    for steps in $PROFILE_SHORT $PROFILE_LONG; do
        printf '[profiling]\nlogger = { level = "basic", file = "%s" }\n' "$RES/profile-$name-$steps.log" \
            > "$prof/cubecl.toml"
        # shellcheck disable=SC2086
        (cd "$prof" && timeout "$(limit)" "$BIN" bench train $shape --precision $SPEED_PRECISION \
            --device "$DEVICE" --steps $steps --json > /dev/null 2>>"$LOG") || log "profile of $name ($steps steps): exit $?"
    done
done

wait
$PY scripts/gpu/tables.py "$RES" > "$OUT/gpu.md" 2>>"$LOG"
rm -f "$RES/.poll" "$RES/.stderr"
log "done"
snapshot
cat "$OUT/gpu.md"
