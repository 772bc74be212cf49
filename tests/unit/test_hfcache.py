"""m3deploy.check.hfcache against a Hugging Face cache laid out exactly as huggingface_hub writes it
(huggingface_hub file_download.py: `refs/<branch>` holds the commit, `snapshots/<commit>/<file>` is a relative
symlink to `blobs/<etag>`, `<etag>.incomplete` while downloading), cross-checked with huggingface_hub itself:
its offline loader accepts a snapshot with a missing shard; our check does not."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess

import huggingface_hub
import pytest

from m3deploy.check import hfcache

REPO = "Inferact/MiniMax-M3-EAGLE3"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def write_repo(hub, repo=REPO, files=None, commit=COMMIT, skip=()):
    """A repo cache as huggingface_hub leaves it after `hf download`; `skip`: files whose download never ran."""
    folder = hub / ("models--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)  # no newline, as huggingface_hub writes it
    snap = folder / "snapshots" / commit
    snap.mkdir(parents=True)
    (folder / "blobs").mkdir()
    for name, data in (files or sharded()).items():
        if name in skip:
            continue
        etag = hashlib.sha256(data).hexdigest()
        (folder / "blobs" / etag).write_bytes(data)
        os.symlink(os.path.relpath(folder / "blobs" / etag, snap), snap / name)
    return folder, snap


def sharded(n=3):
    files = {f"model-{i:05d}-of-{n:05d}.safetensors": os.urandom(64) for i in range(1, n + 1)}
    index = {"metadata": {"total_size": 64 * n},
             "weight_map": {f"layers.{i}.w": f"model-{i % n + 1:05d}-of-{n:05d}.safetensors" for i in range(2 * n)}}
    return {"config.json": b'{"architectures": ["Eagle3"]}', "model.safetensors.index.json": json.dumps(index).encode(),
            **files}


def test_complete_snapshot_passes_and_huggingface_hub_agrees(tmp_path):
    write_repo(tmp_path)
    r = hfcache.check_repo(tmp_path, REPO)
    assert r["ok"] and r["commit"] == COMMIT and r["files"] == 3, r
    # huggingface_hub reads the same layout offline, as the workers do with HF_HUB_OFFLINE=1
    assert huggingface_hub.snapshot_download(REPO, cache_dir=tmp_path, local_files_only=True).endswith(COMMIT)
    info = huggingface_hub.scan_cache_dir(tmp_path)
    assert [(x.repo_id, [rev.commit_hash for rev in x.revisions]) for x in info.repos] == [(REPO, [COMMIT])]


def test_missing_shard_fails_where_huggingface_hub_does_not_notice(tmp_path):
    write_repo(tmp_path, skip={"model-00002-of-00003.safetensors"})
    r = hfcache.check_repo(tmp_path, REPO)
    assert not r["ok"] and "1 of 3 files missing" in r["detail"] and "model-00002-of-00003" in r["detail"]
    huggingface_hub.snapshot_download(REPO, cache_dir=tmp_path, local_files_only=True)  # accepted all the same


def test_in_progress_download_is_named(tmp_path):
    folder, snap = write_repo(tmp_path, skip={"model-00003-of-00003.safetensors"})
    (folder / "blobs" / ("f" * 64 + ".incomplete")).write_bytes(b"12")
    assert "download(s) in progress" in hfcache.check_repo(tmp_path, REPO)["detail"]


@pytest.mark.parametrize("case,detail", [
    ("absent", "does not exist"),
    ("no-ref", "refs/main does not exist"),
    ("no-index-no-weights", "no model.safetensors.index.json and no *.safetensors"),
    ("empty-blob", "missing or empty"),
])
def test_incomplete_caches(tmp_path, case, detail):
    if case == "no-ref":
        folder, _ = write_repo(tmp_path)
        (folder / "refs" / "main").unlink()
    elif case == "no-index-no-weights":
        write_repo(tmp_path, files={"config.json": b"{}"})
    elif case == "empty-blob":
        write_repo(tmp_path, files={"config.json": b"{}", "model.safetensors": b""})
    r = hfcache.check_repo(tmp_path, REPO)
    assert not r["ok"] and detail in r["detail"], r


def test_single_file_model_and_tokenizer_repo(tmp_path):
    write_repo(tmp_path, files={"config.json": b"{}", "model.safetensors": b"x" * 10})
    assert hfcache.check_repo(tmp_path, REPO)["ok"]
    write_repo(tmp_path, repo="Org/Tok", files={"tokenizer.json": b"{}"})
    assert hfcache.check_repo(tmp_path, "Org/Tok", role="tokenizer")["ok"]
    assert not hfcache.check_repo(tmp_path, "Org/Tok")["ok"]  # as a model it lacks config.json
    assert hfcache.check_repo(tmp_path, REPO, revision=COMMIT)["ok"]  # a pinned commit, no ref needed


def test_the_command_hosts_run(tmp_path):
    """What roles/weights.py and verify run on a host: this file through `python3 -` with the specs."""
    write_repo(tmp_path)
    cmd = hfcache.remote_command(str(tmp_path), [f"{REPO}@main:draft", "Org/Absent@main:target"])
    p = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=30)
    got = hfcache.parse_output(p.stdout)
    assert p.returncode == 1 and [(r["repo"], r["ok"]) for r in got] == [(REPO, True), ("Org/Absent", False)]


def test_verify_checks_every_planned_repo_in_each_hosts_cache(tmp_path):
    """`m3deploy verify`'s weights/<host> check, run for real (locally instead of over SSH) on a b200 plan:
    the target and the EAGLE3 draft head both have to be complete."""
    from dataclasses import replace
    from types import SimpleNamespace

    from m3deploy.check import verify
    from m3deploy.cli import load_plan
    from tests.unit.test_plan_snapshots import ROOT

    plan = load_plan(str(ROOT / "inventories" / "b200.py"), [], facts=False)
    hp = next(h for h in plan.hosts if h.weights_dir)
    plan = replace(plan, hosts=(replace(hp, weights_dir=str(tmp_path)),))

    class Local:
        def run(self, name, command):
            p = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)
            return SimpleNamespace(rc=p.returncode, stdout=p.stdout, stderr=p.stderr)

    check = next(c for c in verify.host_checks(plan) if c.id == f"weights/{hp.name}")
    target, draft = (r.repo for r in plan.model_repos)
    write_repo(tmp_path / "hub", repo=target)
    r = verify.run_check(check, Local())
    assert not r.ok and f"{draft}: " in r.evidence and "does not exist" in r.evidence
    write_repo(tmp_path / "hub", repo=draft)
    r = verify.run_check(check, Local())
    assert r.ok and f"{target}: {COMMIT[:12]}: 3 files complete" in r.evidence, r.evidence
