#!/usr/bin/env python3
"""Writes the renderings that memfit-data's chat template tests compare minijinja against.

Renders the templates in crates/memfit-data/tests/templates/ with Jinja2 set up as transformers sets
it up for `apply_chat_template` (transformers/utils/chat_template_utils.py): an
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and the loopcontrols extension, its
own `tojson` filter (json.dumps, ensure_ascii=False) and `raise_exception`; variables `messages`,
`add_generation_prompt`, `tools=None`, `documents=None` and the special tokens. `strftime_now` is
left out as memfit leaves it out (crates/memfit-data/src/chat/template.rs says why).

Run once (the output is committed; the Rust tests need no Python):

    pip install jinja2   # 3.1.x
    python3 scripts/gen_chat_template_golden.py crates/memfit-data/tests/golden/chat_templates.json

For each template and conversation it records the prompt (all messages but the last, with
add_generation_prompt=True) and the whole conversation (add_generation_prompt=False).
"""
import json
import pathlib
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

TEMPLATES = pathlib.Path(__file__).parent.parent / "crates/memfit-data/tests/templates"

# The special tokens each model's tokenizer_config.json names (Qwen2.5-Instruct has no BOS).
TOKENS = {
    "qwen2.5-instruct.jinja": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "llama-3.2-instruct.jinja": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
}

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "5"}],
    [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
    ],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "  你好, 世界 \n"},
        {"role": "assistant", "content": "你好！ 😀"},
    ],
]


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def main(out):
    env = environment()
    result = {}
    for name, tokens in TOKENS.items():
        template = env.from_string((TEMPLATES / name).read_text())

        def render(messages, generation):
            return template.render(messages=messages, add_generation_prompt=generation,
                                   tools=None, documents=None, **tokens)

        result[name] = {
            "tokens": tokens,
            "cases": [
                {"messages": m, "prompt": render(m[:-1], True), "full": render(m, False)}
                for m in CONVERSATIONS
            ],
        }
    pathlib.Path(out).write_text(json.dumps(result, ensure_ascii=False, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
