#!/usr/bin/env bash
# Peak RSS and wall time of `memfit data prepare` on a generated prompt/response parquet file
# (default 2,000,000 rows, GZIP, one row group like the ChatLM fixtures), measured by
# /usr/bin/time -v.
#
#   benches/run_prepare_bench.sh [ROWS]        # PYTHON=/path/to/python with pyarrow
set -euo pipefail

ROWS=${1:-2000000}
PYTHON=${PYTHON:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DATA=$ROOT/target/bench-data
MEMFIT=$ROOT/target/release/memfit
FILE=$DATA/rows-$ROWS.parquet
mkdir -p "$DATA"
(cd "$ROOT" && cargo build --release -p memfit >&2)
[ -f "$FILE" ] || "$PYTHON" "$ROOT/benches/gen_prompt_response.py" --rows "$ROWS" --out "$FILE"
TOKENIZER=${TOKENIZER:-$ROOT/../shared/fixtures/chatlm/tokenizer}
if [ ! -e "$TOKENIZER" ]; then
  TOKENIZER=$DATA/tokenizer
  [ -f "$TOKENIZER/tokenizer.json" ] ||
    "$MEMFIT" tokenizer train --input "$FILE" --vocab-size 8000 --out "$TOKENIZER" >&2
fi
/usr/bin/time -v "$MEMFIT" data prepare --input "$FILE" --tokenizer "$TOKENIZER" \
  --out "$DATA/rows-$ROWS.store" --force --json > "$DATA/prepare-$ROWS.json" 2> "$DATA/prepare-$ROWS.time"
python3 - "$DATA" "$ROWS" <<'PY'
import json, re, sys
data, rows = sys.argv[1], sys.argv[2]
t = open(f"{data}/prepare-{rows}.time").read()
rss_kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", t).group(1))
wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", t).group(1)
meta = json.load(open(f"{data}/prepare-{rows}.json"))
print(f"| rows | tokens | wall time | peak RSS |")
print(f"|---:|---:|---:|---:|")
print(f"| {meta['rows']:,} | {meta['tokens']:,} | {wall} | {rss_kib / 1024:.1f} MiB |")
PY
