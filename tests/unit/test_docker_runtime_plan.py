"""`m3_runtime=docker` in the plan (the mocker through the GPU workers' `docker run --entrypoint` line), the
testbed's `--docker` host options and the archive image id that decides a reload. Run for real by
tests/e2e/test_docker_runtime_testbed.py."""
from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from m3deploy.cli import load_plan
from m3deploy.controller import simimage
from m3deploy.controller.images import archive_image_id
from m3deploy.core.simengine import SIM_DRAFT, SIM_ENGINE, SIM_IMAGE
from m3deploy.testbed import config

ROOT = Path(__file__).resolve().parents[2]
STATE = {"hosts": [{"name": f"m3tb-0{i}", "address": f"10.77.0.{10 + i}"} for i in range(1, 4)],
         "ssh": {"private_key": "/k", "known_hosts": "/kh"}, "image": "/var/cache/x/rootfs"}


@pytest.fixture
def plan(monkeypatch):
    import m3deploy.testbed

    monkeypatch.setattr(m3deploy.testbed, "load_state", lambda *a, **k: STATE)
    monkeypatch.chdir(ROOT)
    return lambda *d: load_plan("inventories/testbed.py", list(d), facts=False)


DOCKER = ("m3_runtime=docker", "m3_weights_source=controller", "m3_mock_repo_mb=8")


def test_mocker_workers_run_in_the_stand_in_image_with_an_explicit_entrypoint(plan):
    cp = plan(*DOCKER)
    svcs = [s for h in cp.hosts for s in h.services if s.kind in ("worker", "scripted")]
    assert len(svcs) == 3
    for s in svcs:
        assert s.image == f"{SIM_IMAGE}:1.6.1" and s.base_image is None  # the stand-in holds Dynamo already
        cmd = list(s.command)
        i = cmd.index(s.image)
        assert cmd[i - 2:i] == ["--entrypoint", f"{cp.venv}/bin/python"] and cmd[i + 1] == SIM_ENGINE
        assert "--network" in cmd and cmd[cmd.index("--network") + 1] == "host"
        assert "/var/lib/m3/hf:/root/.cache/huggingface" in cmd
        assert not any(cp.model_dir in a for a in cmd)  # the staged repos from the HF cache, not the mock dir
        env = dict(s.env)
        assert env["HF_HUB_OFFLINE"] == "1" and env["HOME"] == "/root"
        assert s.workdir == ""
    # the frontend stays native; the default runtime is unchanged
    assert all(not s.image for h in cp.hosts for s in h.services if s.kind == "frontend")
    assert all(not s.image for h in plan().hosts for s in h.services)


def test_docker_workers_name_the_staged_target_and_mock_draft_as_a_gpu_worker_does(plan):
    """model_repos covers the target and the mock EAGLE3 draft; argv names both (`--model-path <repo>`,
    `--speculative-config` JSON "model", as the gb200/b200 plans name theirs); HF_HUB_OFFLINE=1; cache mounted."""
    cp = plan(*DOCKER)
    assert [(r.repo, r.role) for r in cp.model_repos] == [(cp.model_id, "target"), (SIM_DRAFT, "draft")]
    workers = [s for h in cp.hosts for s in h.services if s.kind == "worker"]
    assert workers
    for s in workers:
        argv = list(s.argv)
        assert argv[argv.index("--model-path") + 1] == cp.model_id
        spec = json.loads(argv[argv.index("--speculative-config") + 1])
        assert spec["model"] == SIM_DRAFT and spec["method"] == "eagle3"
        assert dict(s.env)["HF_HUB_OFFLINE"] == "1"
        assert "/var/lib/m3/hf:/root/.cache/huggingface" in s.command
    scripted = next(s for h in cp.hosts for s in h.services if s.kind == "scripted")
    assert scripted.argv[scripted.argv.index("--model-path") + 1] == cp.model_id
    # every worker host stages both repos into the HF cache the containers mount
    assert all(h.weights_dir == "/var/lib/m3/hf" for h in cp.hosts if "workers" in h.groups)
    # the native testbed is unchanged: the mock model dir, no repos, no draft
    native = plan()
    assert native.model_repos == () and not any("--speculative-config" in s.argv for h in native.hosts
                                                 for s in h.services)


def test_docker_testbed_without_staged_repos_is_refused_naming_the_fix(plan):
    from m3deploy.core.errors import ValidationError

    with pytest.raises(ValidationError, match="m3_weights_source=controller --data m3_mock_repo_mb"):
        plan("m3_runtime=docker")


def test_unknown_runtime_is_refused_naming_the_key(plan):
    from m3deploy.core.errors import ValidationError

    with pytest.raises(ValidationError, match="m3_runtime"):
        plan("m3_runtime=podman")


def test_docker_host_options_give_nspawn_what_dockerd_needs():
    args, env = config.nspawn_options(("docker",), "/var/lib/m3deploy/testbed/t/hosts/t-01")
    assert "--capability=CAP_NET_ADMIN" in args
    assert {"--system-call-filter=@keyring", "--system-call-filter=bpf"} <= set(args)
    assert "--bind=/var/lib/m3deploy/testbed/t/hosts/t-01/docker:/var/lib/docker" in args
    assert env == {"SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1", "SYSTEMD_NSPAWN_API_VFS_WRITABLE": "network"}
    assert config.nspawn_options((), "/x") == ([], {})
    # net-admin (a VRRP address on the testbed, tests/e2e/test_testbed_net_admin.py): only the capability
    assert config.nspawn_options(("net-admin",), "/x") == (["--capability=CAP_NET_ADMIN"], {})
    with pytest.raises(Exception, match="unknown testbed host option"):
        config.check_options(("podman",))


def test_archive_image_id_reads_docker_saves_manifest(tmp_path):
    tar = tmp_path / "a.tar"
    with tarfile.open(tar, "w") as t:
        body = json.dumps([{"Config": "ab" * 32 + ".json", "RepoTags": ["x:1"]}]).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(body)
        t.addfile(info, io.BytesIO(body))
    assert archive_image_id(tar) == "sha256:" + "ab" * 32
    (tmp_path / "b.tar").write_bytes(b"not a tar")
    assert archive_image_id(tmp_path / "b.tar") == ""


def test_stand_in_dockerfile_declares_vllms_entrypoint(tmp_path):
    wh = tmp_path / "wh"
    wh.mkdir()
    (wh / "REQUIREMENTS").write_text("ai-dynamo-runtime==1.6.1\n")
    text = simimage.dockerfile("base", "1.6.1", "/opt/m3/dynamo-1.6.1", wh, "d1")
    # vllm-project/vllm docker/Dockerfile, stage vllm-openai
    assert 'ENTRYPOINT ["vllm", "serve"]' in text and "WORKDIR /vllm-workspace" in text
    assert f"COPY m3-sim-engine.py {SIM_ENGINE}" in text and 'io.m3deploy.inputs="d1"' in text
