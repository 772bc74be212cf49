"""m3deploy.controller.mockrepos: mock HF repos in huggingface_hub's own cache layout, deterministic, found
complete by m3deploy.check.hfcache and by huggingface_hub itself (scan_cache_dir, offline snapshot_download)."""
import hashlib
import json

import pytest

from m3deploy.check import hfcache
from m3deploy.controller import mockrepos


def _digests(snap):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(snap.iterdir())}


def test_layout_complete_and_deterministic(tmp_path):
    a = mockrepos.make_repo(tmp_path / "a", "m3deploy/mock-target", size_mb=0.5, shards=3, seed=7)
    b = mockrepos.make_repo(tmp_path / "b", "m3deploy/mock-target", size_mb=0.5, shards=3, seed=7)
    assert a.created and b.created and a.commit == b.commit
    assert (a.folder / "refs" / "main").read_text() == a.commit
    names = [n for n, _ in a.files]
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", mockrepos.INDEX} <= set(names)
    index = json.loads((a.snapshot / mockrepos.INDEX).read_text())
    assert sorted(set(index["weight_map"].values())) == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    for n in names:  # relative symlinks into blobs, as huggingface_hub makes them
        link = a.snapshot / n
        assert link.is_symlink() and str(link.readlink()).startswith("../../blobs/")
    shard = a.snapshot / "model-00001-of-00003.safetensors"
    assert link.resolve().parent == a.folder / "blobs"
    assert shard.resolve().name == hashlib.sha256(shard.read_bytes()).hexdigest()  # LFS etag = sha256
    assert _digests(a.snapshot) == _digests(b.snapshot)
    assert hfcache.check_repo(tmp_path / "a", "m3deploy/mock-target")["ok"]
    c = mockrepos.make_repo(tmp_path / "a", "m3deploy/mock-target", size_mb=0.5, shards=3, seed=7)
    assert not c.created and c.commit == a.commit  # found complete: nothing rewritten
    d = mockrepos.make_repo(tmp_path / "c", "m3deploy/mock-target", size_mb=0.5, shards=3, seed=8)
    assert _digests(d.snapshot)["model-00001-of-00003.safetensors"] != \
        _digests(a.snapshot)["model-00001-of-00003.safetensors"]


def test_shards_are_safetensors_and_draft_config(tmp_path):
    r = mockrepos.make_repo(tmp_path, "m3deploy/mock-eagle3", size_mb=0.1, shards=1, tokenizer=False,
                            config={"architectures": ["Eagle3LlamaForCausalLM"]})
    assert json.loads((r.snapshot / "config.json").read_text())["architectures"] == ["Eagle3LlamaForCausalLM"]
    assert not (r.snapshot / "tokenizer.json").exists()
    # safetensors' format (github.com/huggingface/safetensors README "Format"): u64 LE header size, JSON header,
    # then the tensors' bytes at data_offsets
    data = (r.snapshot / "model-00001-of-00001.safetensors").read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    t = header["mock.layers.0.weight"]
    assert t["dtype"] == "U8" and t["shape"] == [int(0.1 * (1 << 20))]
    assert t["data_offsets"] == [0, len(data) - 8 - n]


def test_huggingface_hub_reads_it_offline(tmp_path):
    hub_lib = pytest.importorskip("huggingface_hub")
    r = mockrepos.make_repo(tmp_path, "m3deploy/mock-target", size_mb=0.2, shards=2)
    scan = hub_lib.scan_cache_dir(tmp_path)
    assert not scan.warnings, scan.warnings
    [info] = scan.repos
    assert info.repo_id == "m3deploy/mock-target" and info.size_on_disk >= r.total_bytes
    got = hub_lib.snapshot_download("m3deploy/mock-target", cache_dir=str(tmp_path), local_files_only=True)
    assert got == str(r.snapshot)
