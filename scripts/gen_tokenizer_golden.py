#!/usr/bin/env python3
"""Writes the golden ids that memfit-data's tokenizer tests compare against.

Run once (the output is committed; the Rust tests need no Python):

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install tokenizers==0.23.3
    /tmp/venv/bin/python scripts/gen_tokenizer_golden.py \
        ../shared/fixtures/chatlm/tokenizer/tokenizer.json \
        crates/memfit-data/tests/golden/chatlm_tokenizer.json

With `--autotokenizer`, the first argument is a memfit checkpoint directory of a run on the ChatLM
tokenizer, and the ids are what transformers' AutoTokenizer gives by default (special tokens added),
for tests/tokenizer_export.rs (needs `pip install transformers`, no torch):

    /tmp/venv/bin/python scripts/gen_tokenizer_golden.py --autotokenizer RUN/checkpoints/step-1 \
        crates/memfit-data/tests/golden/chatlm_autotokenizer.json

The strings cover Chinese, English, mixed text, digits, punctuation, whitespace runs, emoji (out of
vocabulary: [UNK]), special-token text inside a sentence, and the empty string.
"""
import hashlib
import json
import sys

import tokenizers

CASES = [
    "",
    "你好",
    "我要不要去当2021成都大运会志愿者？",
    "35岁会计女，还是基层核算岗位，未来如何职业规划?",
    "问自己，真喜欢吗？开心吗？值得吗？如果都是，就参加吧，如果不是，请告诉主办方。",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "memfit trains transformer models inside a memory budget.",
    "我在学习 Rust 和 Python，版本是 3.11。",
    "CPA注会和税务师都是可以提升一下。SAP的使用或者是oracle的使用",
    "价格：¥1,234.56 （约 $170）",
    "  leading and   multiple   spaces  ",
    "tabs\tand\nnewlines\r\n混合",
    "emoji 😀 不在词表里 🚀",
    "句子里的[EOS]和[PAD]标记",
    "全角ＡＢＣ１２３和半角ABC123",
    "https://example.com/path?q=1&r=2",
    "a-b_c.d/e\\f",
    "日本語のテキストも少し",
    "Ünïcödé àccents ñ",
]


def autotokenizer(checkpoint: str, out_path: str) -> None:
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(checkpoint)
    cases = [{"text": t, "input_ids": tok(t)["input_ids"]} for t in CASES]
    golden = {
        "generated_by": "scripts/gen_tokenizer_golden.py --autotokenizer",
        "transformers_version": transformers.__version__,
        "tokenizer_class": type(tok).__name__,
        "add_special_tokens": True,
        "cases": cases,
    }
    write(golden, cases, out_path)


def write(golden: dict, cases: list, out_path: str) -> None:
    # One case per line keeps the committed file readable and its diffs small.
    head = {k: v for k, v in golden.items() if k != "cases"}
    lines = [json.dumps(c, ensure_ascii=False) for c in cases]
    body = json.dumps(head, ensure_ascii=False, indent=1)[:-2]
    with open(out_path, "w", encoding="utf-8") as f:
        f.write(body + ',\n "cases": [\n  ' + ",\n  ".join(lines) + "\n ]\n}\n")


def main() -> None:
    if sys.argv[1] == "--autotokenizer":
        autotokenizer(sys.argv[2], sys.argv[3])
        return
    tokenizer_path, out_path = sys.argv[1], sys.argv[2]
    with open(tokenizer_path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    tok = tokenizers.Tokenizer.from_file(tokenizer_path)
    cases = []
    for text in CASES:
        enc = tok.encode(text, add_special_tokens=False)
        cases.append({"text": text, "ids": enc.ids})
    golden = {
        "generated_by": "scripts/gen_tokenizer_golden.py",
        "python_tokenizers_version": tokenizers.__version__,
        "tokenizer_sha256": digest,
        "add_special_tokens": False,
        "cases": cases,
    }
    write(golden, cases, out_path)


if __name__ == "__main__":
    main()
