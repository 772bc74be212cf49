"""Is a Hugging Face repo complete in a host's HF cache? Workers run with HF_HUB_OFFLINE=1, so every repo they
open must be there before they start.

The cache layout is huggingface_hub's (file_download.py: `repo_folder_name`, `_get_pointer_path`; constants.py
`REPO_ID_SEPARATOR = "--"`)::

    <HF_HOME>/hub/models--ORG--NAME/refs/main              the commit hash `main` resolved to
                                   /snapshots/<commit>/FILE  symlink -> ../../blobs/<etag>
                                   /blobs/<etag>             the content (<etag>.incomplete while downloading)

A snapshot is complete when its `model.safetensors.index.json` exists and every shard its `weight_map` names
resolves to a non-empty blob (as InferenceX checks M3's checkpoint), or, for a single-file model, every
`*.safetensors` it has does; a tokenizer-only repo needs its tokenizer files. huggingface_hub in offline mode
(`snapshot_download(local_files_only=True)`) accepts a snapshot whose shards are missing: this check does not.

Standard library only: roles/weights.py and `m3deploy verify` run this file on hosts as
`python3 - HUB_DIR REPO[@REVISION][:ROLE] ...`; it prints one JSON line per repo and exits 1 if one is incomplete.
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


def repo_folder(hub: str | os.PathLike, repo: str) -> Path:
    return Path(hub) / ("models--" + repo.replace("/", "--"))


def _resolves(path: Path) -> bool:
    try:
        return path.is_file() and path.stat().st_size > 0
    except OSError:
        return False


def check_repo(hub: str | os.PathLike, repo: str, revision: str = "main", role: str = "target") -> dict:
    """{"repo", "revision", "commit", "ok", "detail", "files"} for one repo in the hub cache `hub`."""
    out = {"repo": repo, "revision": revision, "commit": "", "ok": False, "detail": "", "files": 0}
    folder = repo_folder(hub, repo)
    if not folder.is_dir():
        out["detail"] = f"{folder} does not exist"
        return out
    commit = revision
    if not COMMIT_RE.match(revision):
        ref = folder / "refs" / revision
        if not ref.is_file():
            out["detail"] = f"{ref} does not exist (the download never finished)"
            return out
        commit = ref.read_text().strip()
    out["commit"] = commit
    snap = folder / "snapshots" / commit
    if not snap.is_dir():
        out["detail"] = f"{snap} does not exist"
        return out
    partial = sorted(p.name for p in (folder / "blobs").glob("*.incomplete")) if (folder / "blobs").is_dir() else []
    if role == "tokenizer":
        need = [n for n in TOKENIZER_FILES if (snap / n).exists()]
        if not need:
            out["detail"] = f"{snap} has none of {', '.join(TOKENIZER_FILES)}"
            return out
    else:
        if not _resolves(snap / "config.json"):
            out["detail"] = f"{snap}/config.json is missing"
            return out
        if (snap / INDEX).exists():
            try:
                weight_map = json.loads((snap / INDEX).read_text())["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                out["detail"] = f"{snap / INDEX} is unreadable ({e})"
                return out
            need = sorted(set(weight_map.values()))
        else:
            need = sorted(p.name for p in snap.glob("*.safetensors"))
            if not need:
                out["detail"] = f"{snap} has no {INDEX} and no *.safetensors"
                return out
    missing = [n for n in need if not _resolves(snap / n)]
    out["files"] = len(need) - len(missing)
    if missing:
        out["detail"] = (f"{len(missing)} of {len(need)} files missing or empty in {snap}: {', '.join(missing[:5])}"
                         + (" ..." if len(missing) > 5 else "")
                         + (f"; {len(partial)} download(s) in progress (blobs/*.incomplete)" if partial else ""))
        return out
    out["ok"] = True
    out["detail"] = f"{commit[:12]}: {len(need)} files complete" + (f" ({INDEX})" if role != "tokenizer" and
                                                                      (snap / INDEX).exists() else "")
    return out


def parse_spec(spec: str) -> tuple[str, str, str]:
    """'ORG/NAME[@REVISION][:ROLE]' -> (repo, revision, role)."""
    spec, _, role = spec.partition(":")
    repo, _, rev = spec.partition("@")
    return repo, rev or "main", role or "target"


def spec(repo) -> str:
    """A plan's ModelRepo as this script's argument."""
    return f"{repo.repo}@{repo.revision}:{repo.role}"


def main(argv: list[str]) -> int:
    hub, specs = argv[0], argv[1:]
    ok = True
    for spec in specs:
        r = check_repo(hub, *parse_spec(spec))
        ok &= r["ok"]
        print("M3_HFCACHE " + json.dumps(r), flush=True)
    return 0 if ok else 1


def parse_output(text: str) -> list[dict]:
    return [json.loads(line[len("M3_HFCACHE "):]) for line in text.splitlines() if line.startswith("M3_HFCACHE ")]


def remote_command(hub: str, specs: list[str]) -> str:
    """A shell command running this file on a host with its python3 (stdin), checking `specs`."""
    import base64
    import shlex

    b64 = base64.b64encode(Path(__file__).read_bytes()).decode()
    return f"echo {b64} | base64 -d | python3 - {shlex.quote(hub)} " + " ".join(shlex.quote(s) for s in specs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
