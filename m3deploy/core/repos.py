"""Every Hugging Face repo a worker loads, read from its argv: the target checkpoint, draft heads
(`--speculative-config` JSON's "model"), a separate tokenizer. engines.yaml `repo_args` names, per engine, the
flags that name a repo. Workers run with HF_HUB_OFFLINE=1, so the weights role stages every one of them and the
cache check (m3deploy.check.hfcache) finds each complete before workers start.
"""
from __future__ import annotations

import json
import re
from typing import Iterable, Iterator, Mapping

from m3deploy.core.model import ModelRepo

# a repo id as the Hub spells it (huggingface_hub utils/_validators.py validate_repo_id, namespaced: ORG/NAME, each
# 1-96 ASCII [A-Za-z0-9_.-] beginning and ending with a letter or digit, no "--" or "..", not ending ".git")
_PART = r"[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9_])?"
REPO_RE = re.compile(rf"{_PART}/{_PART}", re.ASCII)


def is_repo_id(value: str) -> bool:
    return (isinstance(value, str) and bool(REPO_RE.fullmatch(value)) and "--" not in value and ".." not in value
            and not value.endswith(".git"))


def _pairs(argv: Iterable[str]) -> Iterator[tuple[str, str]]:
    argv = list(argv)
    for i, tok in enumerate(argv[:-1]):
        if tok.startswith("--"):
            yield tok, argv[i + 1]


def _json_strings(value: str) -> Iterator[tuple[str, str]]:
    try:
        obj = json.loads(value)
    except ValueError:
        return
    stack = [("", obj)]
    while stack:
        key, o = stack.pop()
        if isinstance(o, dict):
            stack += list(o.items())
        elif isinstance(o, list):
            stack += [(key, x) for x in o]
        elif isinstance(o, str):
            yield key, o


def worker_repos(argv: Iterable[str], model_id: str, repo_args: Mapping[str, Mapping]) -> list[ModelRepo]:
    """The repos one worker loads: the target, then each `repo_args` flag's repo."""
    out = [ModelRepo(model_id, "target", "m3_model_id")] if is_repo_id(model_id) else []
    for flag, value in _pairs(argv):
        rule = repo_args.get(flag)
        if not rule:
            continue
        key = rule.get("json_key")
        names = [v for k, v in _json_strings(value) if k == key] if key else [value]
        out += [ModelRepo(n, str(rule["role"]), flag) for n in names if is_repo_id(n)]
    return out


def references(argv: Iterable[str]) -> Iterator[tuple[str, str]]:
    """(flag, repo) for every value in argv that names a repo, inside JSON values too: what validation holds
    against the plan's model_repos."""
    argv = list(argv)
    for i, tok in enumerate(argv):
        flag = argv[i - 1] if i and argv[i - 1].startswith("--") else "(positional)"
        if tok.startswith("--"):
            continue
        if is_repo_id(tok):
            yield flag, tok
        elif tok.startswith(("{", "[")):
            yield from ((flag, v) for _, v in _json_strings(tok) if is_repo_id(v))


def merge(repos: Iterable[ModelRepo]) -> tuple[ModelRepo, ...]:
    """One entry per repo, first writer (the target) first."""
    seen: dict[str, ModelRepo] = {}
    for r in repos:
        seen.setdefault(r.repo, r)
    return tuple(seen.values())
