# Shared setup of the benchmark scripts (sourced, not run). Expects ROWS and PYTHON to be set.
# Sets ROOT, DATA, FILE (generated when missing), MEMFIT (built unless given) and TOKENIZER.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DATA=$ROOT/target/bench-data
FILE=$DATA/rows-$ROWS.parquet
mkdir -p "$DATA"
if [ -z "${MEMFIT:-}" ]; then
  (cd "$ROOT" && cargo build --release -p memfit >&2)
  MEMFIT=$ROOT/target/release/memfit
fi
if [ ! -f "$FILE" ]; then
  echo "generating $FILE" >&2
  "$PYTHON" "$ROOT/benches/gen_prompt_response.py" --rows "$ROWS" --out "$FILE"
fi
# The ChatLM tokenizer when ../shared is present, else one trained on the generated file.
TOKENIZER=${TOKENIZER:-$ROOT/../shared/fixtures/chatlm/tokenizer}
if [ ! -e "$TOKENIZER" ]; then
  TOKENIZER=$DATA/tokenizer
  [ -f "$TOKENIZER/tokenizer.json" ] ||
    "$MEMFIT" tokenizer train --input "$FILE" --vocab-size 8000 --out "$TOKENIZER" >&2
fi
