"""A tokenizer-only model directory for Dynamo's GPU-free `mocker` engine (testbed, CI).

No weights, no network: the tokenizer is a byte-level BPE trained locally with the `tokenizers`
library on a corpus generated from a fixed seed, so every build writes the same bytes (re-deploys
ship nothing). Files: config.json, tokenizer.json, tokenizer_config.json (with a chat template that,
like MiniMax-M3's, takes `thinking_mode` = enabled | disabled | adaptive through
chat_template_kwargs and renders `tools`), generation_config.json.

The vocabulary MUST have >= 2000 entries: the mocker emits random token ids in 1000..1999; with a
smaller vocabulary every reply's content is null (docs/DYNAMO.md).

    python -m m3deploy.controller.mockmodel DIR      # build into DIR, print the digest
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import sys
from pathlib import Path

from m3deploy.core.errors import M3Error

VOCAB_SIZE = 4096
MIN_VOCAB = 2000  # mocker emits ids 1000..1999
MAX_CONTEXT = 196608
SEED = 20260101
NAME = "m3deploy/mock-MiniMax-M3"
FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")

BOS = "<|begin_of_text|>"
EOS = "<|im_end|>"
SPECIAL_TOKENS = (BOS, "<|im_start|>", EOS, "<|endoftext|>", "<mm:think>", "</mm:think>",
                  "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

# MiniMax-M3-like chat template (Jinja2 and minijinja compatible: no Python methods).
# thinking_mode: "enabled" opens a <mm:think> block, "disabled" renders an empty one,
# "adaptive" (default when unset) leaves it to the model.
_CHAT_TEMPLATE_SRC = (
    "{%- set tm = thinking_mode if thinking_mode is defined and thinking_mode else 'adaptive' -%}"
    "{%- macro text(c) -%}"
    "{%- if c is string -%}{{ c }}"
    "{%- elif c is iterable -%}{%- for p in c -%}{%- if p.type == 'text' -%}{{ p.text }}{%- endif -%}{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{{ bos_token }}"
    "{%- set sys = messages[0].role == 'system' -%}"
    "{%- if sys or (tools is defined and tools) -%}"
    "<|im_start|>system\n"
    "{%- if sys -%}{{ text(messages[0].content) }}{%- endif -%}"
    "{%- if tools is defined and tools -%}"
    "\n\n# Tools\nYou may call one or more tools. Available tools:\n<tools>"
    "{%- for t in tools %}\n{{ (t.function if t.function is defined else t) | tojson }}{%- endfor %}\n</tools>\n"
    "To call a tool, answer with <tool_call>{\"name\": NAME, \"arguments\": {...}}</tool_call>."
    "{%- endif -%}"
    "<|im_end|>\n"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if loop.first and sys -%}"
    "{%- elif m.role == 'tool' -%}"
    "<|im_start|>tool\n<tool_response>{{ text(m.content) }}</tool_response><|im_end|>\n"
    "{%- elif m.role == 'assistant' -%}"
    "<|im_start|>assistant\n"
    "{%- if m.reasoning_content is defined and m.reasoning_content -%}"
    "<mm:think>{{ m.reasoning_content }}</mm:think>\n{%- endif -%}"
    "{%- if m.content is defined and m.content -%}{{ text(m.content) }}{%- endif -%}"
    "{%- if m.tool_calls is defined and m.tool_calls -%}"
    "{%- for tc in m.tool_calls -%}"
    "<tool_call>{\"name\": {{ tc.function.name | tojson }}, \"arguments\": "
    "{%- if tc.function.arguments is string %} {{ tc.function.arguments }}"
    "{%- else %} {{ tc.function.arguments | tojson }}{%- endif -%}"
    "}</tool_call>"
    "{%- endfor -%}"
    "{%- endif -%}"
    "<|im_end|>\n"
    "{%- else -%}"
    "<|im_start|>{{ m.role }}\n{{ text(m.content) }}<|im_end|>\n"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt is defined and add_generation_prompt -%}"
    "<|im_start|>assistant\n"
    "{%- if tm == 'enabled' -%}<mm:think>\n"
    "{%- elif tm == 'disabled' -%}<mm:think>\n</mm:think>\n\n"
    "{%- endif -%}"
    "{%- endif -%}"
)
# Every newline the prompt needs is emitted as an expression, so `{%- -%}` trimming never eats it.
CHAT_TEMPLATE = _CHAT_TEMPLATE_SRC.replace("\n", "{{ '\\n' }}")

_SYLLABLES = ("ka ri to na mi so ve lo ra de an in on er es at is or ul am ex th sh ch qu st pr tr "
              "gr bl cl fl pl sp sk sm sn sw tw wh ph ea ou ai ie oo ee ck ng nt nd ld rd").split()
_CODE = ("def return import from class self None True False for while if else elif try except "
         "json {\"name\": \"arguments\": []} () => == != <= >= += -= ** // && || :: -> "
         "GPU NVIDIA AMD H200 B200 GB200 MI300X MI355X vLLM SGLang Dynamo etcd NATS KV cache "
         "token tokens prompt model MiniMax M3 tensor parallel expert attention sparse block").split()


def _corpus(seed: int = SEED, lines: int = 6000) -> list[str]:
    """Deterministic pseudo-text with enough distinct pairs for VOCAB_SIZE merges."""
    rng = random.Random(seed)
    words = sorted({"".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4)))
                    for _ in range(6000)})
    out = []
    for i in range(lines):
        n = rng.randint(6, 18)
        ws = [rng.choice(words) if rng.random() < 0.8 else rng.choice(_CODE) for _ in range(n)]
        if rng.random() < 0.3:
            ws[0] = ws[0].capitalize()
        sep = rng.choice((". ", ", ", "; ", "\n", " "))
        out.append(" ".join(ws) + sep + str(rng.randint(0, 100000)))
    return out


def build_tokenizer_json(vocab_size: int = VOCAB_SIZE) -> str:
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    except ImportError as e:  # pragma: no cover
        raise M3Error("the mock model needs the `tokenizers` package on the controller; "
                      "fix: pip install 'm3deploy[mocker]'") from e
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer=trainer)
    n = tok.get_vocab_size()
    if n < MIN_VOCAB:
        raise M3Error(f"mock tokenizer has {n} entries, needs >= {MIN_VOCAB} (mocker emits ids 1000..1999)")
    # Canonical JSON (sorted keys) so the bytes never depend on library dict order.
    return json.dumps(json.loads(tok.to_str()), sort_keys=True, ensure_ascii=False, indent=1) + "\n"


def _dump(obj) -> str:
    return json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def build_files(served_name: str = NAME, max_context: int = MAX_CONTEXT) -> dict[str, str]:
    """The model directory's files as {name: text}. Pure and deterministic."""
    tj = build_tokenizer_json()
    vocab = json.loads(tj)
    ids = {t["content"]: t["id"] for t in vocab["added_tokens"]}
    vocab_size = len(vocab["model"]["vocab"])
    config = {
        "_name_or_path": served_name,
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "comment": "m3deploy mock model for Dynamo's mocker engine: tokenizer only, no weights",
        "vocab_size": vocab_size,
        "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 2,
        "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 64,
        "max_position_embeddings": max_context,
        "bos_token_id": ids[BOS], "eos_token_id": ids[EOS],
        "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    }
    gen = {"bos_token_id": ids[BOS], "eos_token_id": [ids[EOS], ids["<|endoftext|>"]],
           "do_sample": True, "temperature": 1.0, "top_p": 0.95, "top_k": 40}
    tcfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS, "eos_token": EOS, "pad_token": "<|endoftext|>", "unk_token": None,
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "model_max_length": max_context,
        "added_tokens_decoder": {str(i): {"content": c, "lstrip": False, "normalized": False,
                                          "rstrip": False, "single_word": False, "special": True}
                                 for c, i in sorted(ids.items(), key=lambda kv: kv[1])},
        "chat_template": CHAT_TEMPLATE,
    }
    return {"config.json": _dump(config), "generation_config.json": _dump(gen),
            "tokenizer.json": tj, "tokenizer_config.json": _dump(tcfg)}


def digest(files: dict[str, str]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    return h.hexdigest()


def write_model_dir(directory: str | os.PathLike, served_name: str = NAME) -> str:
    """Write (only files whose bytes differ) into directory; return the content digest."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    files = build_files(served_name)
    for name, text in files.items():
        p = d / name
        data = text.encode()
        if p.is_file() and p.read_bytes() == data:
            continue
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(p)
    return digest(files)


_built: dict[tuple[str, str], Path] = {}  # (cache root, served name) -> published directory, in this process


def _pointer(served_name: str) -> Path:
    from m3deploy.controller.artifacts import cache_root

    key = hashlib.sha256((served_name + "\0" + Path(__file__).read_text()).encode()).hexdigest()[:16]
    return cache_root() / "mock-model" / f"by-source-{key}"


def cached_model_dir(served_name: str = NAME) -> Path | None:
    """The published copy for `served_name` and this generator's source, or None (builds nothing)."""
    pointer = _pointer(served_name)
    d = pointer.parent / pointer.read_text().strip() if pointer.is_file() else None
    return d if d is not None and all((d / n).is_file() for n in FILES) else None


def ensure_model_dir(served_name: str = NAME) -> Path:
    """The controller's cached copy: ~/.cache/m3deploy/mock-model/<digest-prefix>/ (built once).

    Training the tokenizer takes ~0.5 s, so the digest directory is remembered per (served name, this
    generator's source) in `by-source-<key>`: later runs only read the cached files. Safe under concurrency
    (m3deploy.controller.cachelock): built in a private directory under the lock, published with one rename."""
    from m3deploy.controller.cachelock import build_dir_once

    pointer = _pointer(served_name)
    memo = (str(pointer.parent), served_name)
    if memo in _built and all((_built[memo] / n).is_file() for n in FILES):
        return _built[memo]
    d = build_dir_once(pointer, f"the mock model for {served_name}", lambda: cached_model_dir(served_name),
                       lambda: build_files(served_name), digest, FILES)
    _built[memo] = d
    return d


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else str(ensure_model_dir())
    print(target, write_model_dir(target))
