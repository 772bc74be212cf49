"""A tiny random-weights model directory that a real vLLM on CPU serves (the testbed's `m3_engine = "vllm"`).

The mock model's tokenizer and chat template (m3deploy.controller.mockmodel: M3's `<mm:think>`/`</mm:think>`,
`thinking_mode`, tools) plus MiniMax-M3's tool-call delimiters `]<]minimax[>[<tool_call>` /
`]<]minimax[>[</tool_call>` as special tokens, a Llama config small enough for one CPU core (hidden 128, 2 layers,
4 heads, 2 KV heads, head_dim 32: a head size vLLM's CPU attention backend takes) and `model.safetensors` with
weights from a fixed seed (bf16, ~2 MB), written with the standard library: every build writes the same bytes, so
a re-deploy ships nothing. vLLM's `minimax_m3` reasoning parser refuses a tokenizer without the think tokens
("could not locate think start/end tokens"); this one has them.

    python -m m3deploy.controller.tinymodel DIR      # build into DIR, print the digest
"""
from __future__ import annotations

import array
import hashlib
import json
import random
import sys
from pathlib import Path

from m3deploy.controller import mockmodel
from m3deploy.core import catalog

NAME = mockmodel.NAME
SEED = 20261206
MAX_POSITIONS = int(catalog.engines()["vllm"]["cpu"]["max_context"])  # the window the plan validates against
WEIGHTS = "model.safetensors"
FILES = (*mockmodel.FILES, WEIGHTS)
TOOL_TOKENS = ("]<]minimax[>[<tool_call>", "]<]minimax[>[</tool_call>")
SHAPE = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 32}


def _tokenizer_json() -> str:
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_str(mockmodel.build_tokenizer_json())
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in TOOL_TOKENS])
    return json.dumps(json.loads(tok.to_str()), sort_keys=True, ensure_ascii=False, indent=1) + "\n"


def _tensors(vocab: int) -> list[tuple[str, list[int]]]:
    h, i, d = SHAPE["hidden_size"], SHAPE["intermediate_size"], SHAPE["head_dim"]
    q, kv = SHAPE["num_attention_heads"] * d, SHAPE["num_key_value_heads"] * d
    out = [("model.embed_tokens.weight", [vocab, h]), ("model.norm.weight", [h])]
    for n in range(SHAPE["num_hidden_layers"]):
        p = f"model.layers.{n}."
        out += [(p + "input_layernorm.weight", [h]), (p + "post_attention_layernorm.weight", [h]),
                (p + "self_attn.q_proj.weight", [q, h]), (p + "self_attn.k_proj.weight", [kv, h]),
                (p + "self_attn.v_proj.weight", [kv, h]), (p + "self_attn.o_proj.weight", [h, q]),
                (p + "mlp.gate_proj.weight", [i, h]), (p + "mlp.up_proj.weight", [i, h]),
                (p + "mlp.down_proj.weight", [h, i])]
    return sorted(out)


def _bf16(values: array.array) -> bytes:
    """float32 values as bf16 (the upper half of each little-endian float32)."""
    raw = values.tobytes()
    return b"".join(raw[k + 2:k + 4] for k in range(0, len(raw), 4))


def safetensors(vocab: int, seed: int = SEED) -> bytes:
    """The weights file: norms 1.0, every matrix N(0, 0.02) from `seed` (bf16)."""
    rng = random.Random(seed)
    header: dict = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, shape in _tensors(vocab):
        n = 1
        for x in shape:
            n *= x
        vals = array.array("f", [1.0] * n if name.endswith("norm.weight") else
                           [rng.gauss(0.0, 0.02) for _ in range(n)])
        blob = _bf16(vals)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return len(head).to_bytes(8, "little") + head + b"".join(blobs)


def build_files(served_name: str = NAME) -> dict[str, bytes]:
    """The model directory's files as {name: bytes}. Pure and deterministic."""
    files = {k: v.encode() for k, v in mockmodel.build_files(served_name, MAX_POSITIONS).items()}
    tj = _tokenizer_json()
    vocab = json.loads(tj)
    vocab_size = max(t["id"] for t in vocab["added_tokens"]) + 1
    vocab_size = max(vocab_size, len(vocab["model"]["vocab"]))
    config = json.loads(files["config.json"])
    config.update(SHAPE, vocab_size=vocab_size, tie_word_embeddings=True, rms_norm_eps=1e-5,
                  comment="m3deploy tiny model for a real vLLM on CPU: random weights (seed %d)" % SEED)
    tcfg = json.loads(files["tokenizer_config.json"])
    ids = {t["content"]: t["id"] for t in vocab["added_tokens"]}
    tcfg["added_tokens_decoder"] = {str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                                             "single_word": False, "special": True}
                                    for c, i in sorted(ids.items(), key=lambda kv: kv[1])}
    files.update({"config.json": mockmodel._dump(config).encode(), "tokenizer.json": tj.encode(),
                  "tokenizer_config.json": mockmodel._dump(tcfg).encode(), WEIGHTS: safetensors(vocab_size)})
    return files


def digest(files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name] + b"\0")
    return h.hexdigest()


def _pointer(served_name: str) -> Path:
    from m3deploy.controller.artifacts import cache_root

    src = Path(__file__).read_text() + Path(mockmodel.__file__).read_text()
    key = hashlib.sha256((served_name + "\0" + src).encode()).hexdigest()[:16]
    return cache_root() / "tiny-model" / f"by-source-{key}"


def cached_model_dir(served_name: str = NAME) -> Path | None:
    """The published copy for `served_name` and this generator's source, or None (builds nothing)."""
    pointer = _pointer(served_name)
    d = pointer.parent / pointer.read_text().strip() if pointer.is_file() else None
    return d if d is not None and all((d / n).is_file() for n in FILES) else None


_built: dict[tuple[str, str], Path] = {}


def ensure_model_dir(served_name: str = NAME) -> Path:
    """The controller's cached copy: ~/.cache/m3deploy/tiny-model/<digest-prefix>/, built once (~2 s), under the
    lock, in a private directory published with one rename (as the mock model's)."""
    from m3deploy.controller.cachelock import build_dir_once

    pointer = _pointer(served_name)
    memo = (str(pointer.parent), served_name)
    if memo in _built and all((_built[memo] / n).is_file() for n in FILES):
        return _built[memo]
    d = build_dir_once(pointer, f"the tiny model for {served_name}", lambda: cached_model_dir(served_name),
                       lambda: build_files(served_name), digest, FILES)
    _built[memo] = d
    return d


if __name__ == "__main__":
    print(ensure_model_dir(sys.argv[1] if len(sys.argv) > 1 else NAME))
