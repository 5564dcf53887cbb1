#!/usr/bin/env bash
# Builds the release memfit with burn's CUDA backend and packs it for a GPU machine that has no Rust
# toolchain and no network (docs/gpu.md): .gpu/memfit.xz (stripped, xz) and .gpu/memfit-fusion.xz (the same
# with burn's kernel fusion, timed beside it), with the PyTorch baselines
# scripts/gpu/accept.sh measures beside it. Then, on the GPU machine with the working tree and .gpu/,
# from the repository root:  bash scripts/gpu/accept.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
target=${CARGO_TARGET_DIR:-target}
mkdir -p .gpu/pytorch
# Beside it, the build with burn's kernel fusion, which accept.sh times against it (docs/gpu.md, Build).
cargo build --release -p memfit --features cuda,fusion
strip -o .gpu/memfit-fusion "$target/release/memfit"
xz -T0 -6 -f .gpu/memfit-fusion
cargo build --release -p memfit --features cuda
strip -o .gpu/memfit "$target/release/memfit"
xz -T0 -6 -f .gpu/memfit
baselines=${MEMFIT_PYTORCH_BENCH:-../shared/bench/pytorch}
cp "$baselines"/bench_t5.py "$baselines"/bench_bert_cls.py "$baselines"/bench_causal_lora.py \
    "$baselines"/benchcommon.py .gpu/pytorch/
du -sh .gpu .gpu/memfit.xz
