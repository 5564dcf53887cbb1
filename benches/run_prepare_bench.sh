#!/usr/bin/env bash
# Peak RSS and wall time of `memfit data prepare` on a generated prompt/response parquet file
# (default 2,000,000 rows, GZIP, one row group like the ChatLM fixtures), measured by
# /usr/bin/time -v.
#
#   benches/run_prepare_bench.sh [ROWS]
#
# PYTHON=/path/to/python (with pyarrow) generates the data; MEMFIT=/path/to/memfit skips the build.
set -euo pipefail

ROWS=${1:-2000000}
PYTHON=${PYTHON:-python3}
source "$(dirname "$0")/common.sh"

/usr/bin/time -v "$MEMFIT" data prepare --input "$FILE" --tokenizer "$TOKENIZER" \
  --out "$DATA/rows-$ROWS.store" --force --json > "$DATA/prepare-$ROWS.json" 2> "$DATA/prepare-$ROWS.time"
"$PYTHON" - "$DATA" "$ROWS" <<'PY'
import json, re, sys
data, rows = sys.argv[1], sys.argv[2]
t = open(f"{data}/prepare-{rows}.time").read()
rss_kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", t).group(1))
wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", t).group(1)
meta = json.load(open(f"{data}/prepare-{rows}.json"))
print("| rows | tokens | wall time | peak RSS |")
print("|---:|---:|---:|---:|")
print(f"| {meta['rows']:,} | {meta['tokens']:,} | {wall} | {rss_kib / 1024:.1f} MiB |")
PY
