#!/usr/bin/env bash
# Issue 29: one JSONL line of SIZE (default 1 GiB) through `memfit data prepare`, `memfit train --data`
# and `memfit tokenizer train`: each must exit 2 naming the line, its size and the limit, with its
# peak RSS (GNU time's maxrss, the child's VmHWM) far below the line. Too slow for the test suite
# (writing and reading 1 GiB); run by hand:   scripts/bench_row_limit.sh [SIZE_MIB] [MEMFIT]
set -euo pipefail
size_mib=${1:-1024}
memfit=${2:-target/release/memfit}
memfit=$(realpath "$memfit")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
python3 - "$size_mib" <<'PY'
import sys
size = int(sys.argv[1]) << 20
words = b"lorem ipsum dolor sit amet " * 40000
with open("small.jsonl", "wb") as f:
    for i in range(200):
        f.write(b'{"prompt": "the quick brown fox %d", "response": "jumps over"}\n' % i)
with open("big.jsonl", "wb") as f:
    f.write(b'{"prompt": "the quick brown fox", "response": "jumps"}\n{"prompt": "')
    left = size
    while left > 0:
        n = min(left, len(words))
        f.write(words[:n])
        left -= n
    f.write(b'", "response": "x"}\n')
PY
"$memfit" tokenizer train --input small.jsonl --vocab-size 200 --out tok >/dev/null
echo '{"model_type": "t5", "vocab_size": 200, "d_model": 8, "d_kv": 4, "d_ff": 16, "num_layers": 1, "num_heads": 2}' > t5.json
echo "line 2: $(( (size_mib << 20) + 31 )) bytes"
run() {
    local name=$1; shift
    local code=0
    /usr/bin/time -f "%M %e" -o time.txt "$memfit" "$@" 2>err.txt >/dev/null || code=$?
    read -r kib secs < <(tail -1 time.txt)
    printf '%-16s exit %s  peak RSS %6.1f MiB  %5.1f s  %s\n' "$name" "$code" \
        "$(echo "$kib / 1024" | bc -l)" "$secs" "$(grep -o 'line 2.*' err.txt | head -c 160)"
}
run "data prepare" data prepare --input big.jsonl --tokenizer tok --out big.store
run "train --data" train --model t5.json --data big.jsonl --tokenizer tok --out run --max-steps 1
run "tokenizer train" tokenizer train --input big.jsonl --vocab-size 100 --out tok2
run "prepare skip" data prepare --input big.jsonl --tokenizer tok --out big.store --on-invalid skip
