"""Mock Hugging Face repos in the real HF cache layout, on the controller: what the testbed stages to its hosts
(weights fan-out, docs/WEIGHTS.md) and what its HF-offline workers load (a target and a mock EAGLE3 draft).

Layout (huggingface_hub's: file_download.py `repo_folder_name`, `_get_pointer_path`, `_create_symlink`)::

    HUB/models--ORG--NAME/refs/main                         the commit (40 hex)
                         /snapshots/<commit>/FILE -> ../../blobs/<etag>   relative symlinks
                         /blobs/<etag>                       sha256 (safetensors, as LFS files) or git-sha1

Files: config.json, generation_config.json, optionally the mock tokenizer (tokenizer.json,
tokenizer_config.json from m3deploy.controller.mockmodel, what the mocker engine needs),
model.safetensors.index.json naming `shards` files model-0000i-of-0000N.safetensors. Each shard is a valid
safetensors file (8-byte header length, JSON header, one U8 tensor) of about `size_mb / shards` MB of bytes
drawn from `random.Random(seed)`: the same arguments write the same bytes, blobs and commit on every machine.

The commit is derived from the arguments (and this file's format version), so a complete snapshot is found
and kept without regenerating anything; it is built under the repo's lock (m3deploy.controller.cachelock, the
lock file under HUB/.locks/, where huggingface_hub keeps its own), into temporary blobs renamed into place.

    make_repo(hub, "m3deploy/mock-target", size_mb=300, shards=4)          -> MockRepo
    make_repo(hub, "m3deploy/mock-eagle3", size_mb=20, tokenizer=False, config={"architectures": [...]})
    python -m m3deploy.controller.mockrepos HUB ORG/NAME [SIZE_MB [SHARDS [SEED]]]
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

FORMAT = 1  # bump when the bytes a given set of arguments writes change
INDEX = "model.safetensors.index.json"
_CHUNK = 8 << 20


@dataclass(frozen=True)
class MockRepo:
    repo: str  # ORG/NAME
    commit: str  # what refs/<revision> holds
    folder: Path  # HUB/models--ORG--NAME
    snapshot: Path  # folder/snapshots/<commit>
    files: tuple[tuple[str, int], ...]  # (name in the snapshot, size in bytes), sorted
    created: bool  # False when a complete copy was already there

    @property
    def total_bytes(self) -> int:
        return sum(n for _, n in self.files)


def repo_folder(hub: str | os.PathLike, repo: str) -> Path:
    return Path(hub) / ("models--" + repo.replace("/", "--"))


def _shard_name(i: int, n: int) -> str:
    return f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def _commit(repo, size_mb, shards, seed, tokenizer, config, revision) -> str:
    key = json.dumps([FORMAT, repo, size_mb, shards, seed, tokenizer, config, revision], sort_keys=True)
    return hashlib.sha1(key.encode()).hexdigest()


def _git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _small_files(repo: str, size_mb: float, shards: int, tokenizer: bool, config: dict | None) -> dict[str, bytes]:
    from m3deploy.controller import mockmodel

    out: dict[str, bytes] = {}
    if tokenizer:
        built = mockmodel.build_files(repo)
        out.update({k: v.encode() for k, v in built.items()})
        cfg = json.loads(built["config.json"])
    else:
        cfg = {"_name_or_path": repo, "architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    cfg["comment"] = f"m3deploy mock repo: {shards} shard(s) of random bytes, no real weights"
    cfg.update(config or {})
    out["config.json"] = (json.dumps(cfg, sort_keys=True, indent=2) + "\n").encode()
    out.setdefault("generation_config.json", b'{"do_sample": true}\n')
    per = _shard_bytes(size_mb, shards)
    index = {"metadata": {"total_size": per * shards},
             "weight_map": {f"mock.layers.{i}.weight": _shard_name(i, shards) for i in range(shards)}}
    out[INDEX] = (json.dumps(index, sort_keys=True, indent=2) + "\n").encode()
    return out


def _shard_bytes(size_mb: float, shards: int) -> int:
    return max(1, int(size_mb * (1 << 20)) // shards)


def _write_shard(path: Path, rng: random.Random, i: int, n_bytes: int) -> str:
    """A safetensors file holding one U8 tensor of n_bytes random bytes; returns its sha256."""
    header = json.dumps({"__metadata__": {"format": "pt"},
                         f"mock.layers.{i}.weight": {"dtype": "U8", "shape": [n_bytes],
                                                     "data_offsets": [0, n_bytes]}}).encode()
    header += b" " * (-len(header) % 8)
    h = hashlib.sha256()
    with open(path, "wb") as f:
        for part in (struct.pack("<Q", len(header)), header):
            f.write(part)
            h.update(part)
        left = n_bytes
        while left:
            chunk = rng.randbytes(min(_CHUNK, left))
            f.write(chunk)
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


def _complete(snap: Path, names) -> bool:
    return all((snap / n).is_file() and (snap / n).stat().st_size > 0 for n in names)


def make_repo(hub: str | os.PathLike, repo: str, *, size_mb: float = 100, shards: int = 2, seed: int = 0,
              tokenizer: bool = True, config: dict | None = None, revision: str = "main") -> MockRepo:
    """Build (or find complete) the mock repo `repo` in the HF hub cache directory `hub` (HF_HOME/hub)."""
    from m3deploy.controller.cachelock import locked

    if "/" not in repo or shards < 1 or size_mb <= 0:
        raise ValueError(f"mock repo {repo!r}: needs ORG/NAME, shards >= 1 and size_mb > 0")
    hub = Path(hub)
    folder = repo_folder(hub, repo)
    commit = _commit(repo, size_mb, shards, seed, tokenizer, config or {}, revision)
    snap = folder / "snapshots" / commit
    small = _small_files(repo, size_mb, shards, tokenizer, config)
    names = sorted([*small, *(_shard_name(i, shards) for i in range(shards))])
    lock = hub / ".locks" / folder.name / "m3deploy-mockrepo"
    with locked(lock, f"the mock repo {repo}"):
        created = False
        if not (_complete(snap, names) and (folder / "refs" / revision).is_file()
                and (folder / "refs" / revision).read_text().strip() == commit):
            created = True
            blobs = folder / "blobs"
            for d in (blobs, snap, folder / "refs"):
                d.mkdir(parents=True, exist_ok=True)
            rng = random.Random(f"{seed}:{repo}")
            per = _shard_bytes(size_mb, shards)
            targets: dict[str, str] = {}
            for name, data in small.items():
                etag = _git_sha1(data)
                if not (blobs / etag).is_file():
                    tmp = blobs / f"{etag}.incomplete"
                    tmp.write_bytes(data)
                    tmp.replace(blobs / etag)
                targets[name] = etag
            for i in range(shards):  # every shard drawn in order, so shard i's bytes never depend on what exists
                tmp = blobs / f".m3-shard-{i}.incomplete"
                etag = _write_shard(tmp, rng, i, per)
                tmp.replace(blobs / etag)
                targets[_shard_name(i, shards)] = etag
            for name, etag in targets.items():
                link = snap / name
                if link.is_symlink() or link.exists():
                    link.unlink()
                os.symlink(f"../../blobs/{etag}", link)
            ref = folder / "refs" / revision
            ref.with_suffix(".tmp").write_text(commit)
            ref.with_suffix(".tmp").replace(ref)
    files = tuple((n, (snap / n).stat().st_size) for n in names)
    return MockRepo(repo=repo, commit=commit, folder=folder, snapshot=snap, files=files, created=created)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    hub, repo, *rest = argv
    size_mb, shards, seed = (float(rest[0]) if rest else 100), (int(rest[1]) if len(rest) > 1 else 2), \
        (int(rest[2]) if len(rest) > 2 else 0)
    r = make_repo(hub, repo, size_mb=size_mb, shards=shards, seed=seed)
    print(json.dumps({"repo": r.repo, "commit": r.commit, "snapshot": str(r.snapshot), "bytes": r.total_bytes,
                      "created": r.created}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
