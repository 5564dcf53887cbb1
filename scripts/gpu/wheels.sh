#!/usr/bin/env bash
# Puts the bitsandbytes wheel that scripts/gpu/pool.sh installs on a GPU machine without network
# (ROWS=scripts/gpu/qlora_runs.csv) into .gpu-wheels/ (43 MB; the device tool carries 64 MiB a call,
# so it travels on its own, without .gpu). Run here, where PyPI is reachable.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gpu-wheels
python3 -m pip download --quiet --no-deps --dest .gpu-wheels "bitsandbytes==${BNB_VERSION:-0.50.2}"
ls -la .gpu-wheels
