#!/usr/bin/env bash
# Writes the PyTorch-stack configs `memfit plan` emits for several setups (DDP, DeepSpeed ZeRO,
# FSDP2, FSDP1; one node and two) and loads each through accelerate's and transformers' own code
# (scripts/check_emitted_configs.py). Needs a Python with torch, accelerate and transformers:
#   python3 -m venv /work/venv-accel && /work/venv-accel/bin/pip install torch accelerate transformers
#   PYTHON=/work/venv-accel/bin/python scripts/check_emitted_configs.sh
# MEMFIT names the binary (default target/release/memfit). No GPU is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
MEMFIT=${MEMFIT:-target/release/memfit}
PYTHON=${PYTHON:-python3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

plan() { # name, then memfit plan arguments
    local name=$1
    shift
    "$MEMFIT" plan --model t5-base --seq 512 --host-mem 64GiB --emit accelerate,hf,deepspeed \
        --out "$out/$name" "$@" >/dev/null
    echo "$out/$name"
}

dirs=(
    "$(plan ddp-3gpu --gpus 3 --gpu-mem 80GiB --target-batch 96)"
    "$(plan zero-3gpu --gpus 3 --gpu-mem 8GiB --target-batch 96)"
    "$(plan fsdp2-3gpu --gpus 3 --gpu-mem 8GiB --target-batch 96 --sharding fsdp2)"
    "$(plan fsdp1-3gpu --gpus 3 --gpu-mem 8GiB --target-batch 96 --sharding fsdp1)"
    "$(plan fsdp2-2x4 --nodes 2 --gpus 4 --gpu-mem 6GiB --target-batch 128 --sharding fsdp2)"
)
"$PYTHON" scripts/check_emitted_configs.py "${dirs[@]}"
