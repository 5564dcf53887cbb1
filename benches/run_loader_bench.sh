#!/usr/bin/env bash
# Random access to rows of a prompt/response dataset: memfit's token store against the seed's
# LowMemDataset (pyarrow, standard and ultra modes), measured in one run, printed as one table.
#
#   pip install pyarrow            # in any venv; PYTHON=/path/to/python to choose it
#   benches/run_loader_bench.sh [ROWS] [RANDOM_ROWS] [ULTRA_ROWS]
#
# Defaults: 1,000,000 rows, 10,000 random reads for memfit and standard mode, and 20 for ultra
# mode (it re-reads the whole file per row: 10,000 reads would take hours). Data is generated into
# target/bench-data/ (ignored by git). The tokenizer is the ChatLM one from ../shared when present,
# else one trained by `memfit tokenizer train` on the generated file (TOKENIZER=... overrides);
# MEMFIT=/path/to/memfit skips the build.
set -euo pipefail

ROWS=${1:-1000000}
RANDOM_ROWS=${2:-10000}
ULTRA_ROWS=${3:-20}
PYTHON=${PYTHON:-python3}
source "$(dirname "$0")/common.sh"
STORE=$DATA/rows-$ROWS.store

echo "preparing $STORE (reused when up to date)" >&2
"$MEMFIT" data prepare --input "$FILE" --tokenizer "$TOKENIZER" --out "$STORE" --json > "$DATA/prepare.json"

echo "memfit: $RANDOM_ROWS random rows" >&2
"$MEMFIT" bench data --store "$STORE" --random "$RANDOM_ROWS" --json > "$DATA/memfit.json"
echo "seed standard: $RANDOM_ROWS random rows" >&2
"$PYTHON" "$ROOT/benches/seed_loader.py" --mode standard --file "$FILE" --random "$RANDOM_ROWS" --json > "$DATA/standard.json"
echo "seed ultra: $ULTRA_ROWS random rows" >&2
"$PYTHON" "$ROOT/benches/seed_loader.py" --mode ultra --file "$FILE" --random "$ULTRA_ROWS" --json > "$DATA/ultra.json"

"$PYTHON" - "$DATA" "$ROWS" <<'PY'
import json, sys
data, rows = sys.argv[1], int(sys.argv[2])
m, s, u = (json.load(open(f"{data}/{n}.json")) for n in ("memfit", "standard", "ultra"))
mib = lambda b: b / 2**20
def us(r): return r["ns_per_row_median"] / 1000
print(f"{rows:,}-row parquet, random row reads, one run:\n")
print("| loader | rows read | median time per row | peak RSS |")
print("|---|---:|---:|---:|")
print(f"| memfit token store (`memfit bench data`) | {m['rows']:,} | {us(m):.2f} µs | {mib(m['peak_rss_bytes']):.1f} MiB |")
print(f"| seed standard (read_table once, slice per row) | {s['rows']:,} | {us(s):.2f} µs | {mib(s['peak_rss_bytes']):.1f} MiB |")
print(f"| seed ultra (re-read file per row) | {u['rows']:,} | {us(u):,.0f} µs | {mib(u['peak_rss_bytes']):.1f} MiB |")
print()
print(f"memfit RSS / standard RSS = 1/{s['peak_rss_bytes'] / m['peak_rss_bytes']:.1f}; "
      f"ultra time / memfit time = {u['ns_per_row_median'] / m['ns_per_row_median']:,.0f}x; "
      f"standard time / memfit time = {s['ns_per_row_median'] / m['ns_per_row_median']:,.1f}x")
PY
