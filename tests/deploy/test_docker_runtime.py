"""`m3_runtime=docker` on the testbed inventory, through pyinfra's @fake connector: the roles a GPU worker goes
through (runtime, images, workers, teardown) with the mocker in the stand-in engine image. Run for real by
tests/e2e/test_docker_runtime_testbed.py."""
from __future__ import annotations

import io
import json
import tarfile

import pytest

from m3deploy import facts
from m3deploy.cli import load_plan
from m3deploy.core.simengine import SIM_ENGINE, SIM_IMAGE
from roles.images import deploy_images, image_archive_name
from roles.runtime import deploy_runtime
from roles.teardown import teardown
from roles.workers import deploy_workers

STATE = {"hosts": [{"name": f"m3tb-0{i}", "address": f"10.77.0.{10 + i}"} for i in range(1, 4)],
         "ssh": {"private_key": "/k", "known_hosts": "/kh"}, "image": "/var/cache/m3deploy/testbed/images/x/rootfs"}
IMAGE = f"{SIM_IMAGE}:1.6.1"
ID = "sha256:" + "ab" * 32
DEBIAN = {"id": "debian", "version_id": "12", "pretty": "Debian GNU/Linux 12 (bookworm)"}


@pytest.fixture
def plan(monkeypatch, tmp_path):
    import m3deploy.testbed

    monkeypatch.setattr(m3deploy.testbed, "load_state", lambda *a, **k: STATE)
    monkeypatch.setenv("M3DEPLOY_CONFIG", str(tmp_path / "config"))

    def _plan(*data):
        return load_plan("inventories/testbed.py", ["m3_runtime=docker", "m3_weights_source=controller",
                                                     "m3_mock_repo_mb=8", *data], facts=False)
    return _plan


def archive(directory, image_id: str):
    """A `docker save` archive as docker 20.10 writes it: manifest.json names the config blob `<hex>.json`."""
    tar = directory / image_archive_name(IMAGE)
    with tarfile.open(tar, "w") as t:
        body = json.dumps([{"Config": image_id.split(":", 1)[1] + ".json", "RepoTags": [IMAGE]}]).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(body)
        t.addfile(info, io.BytesIO(body))
    return tar


def test_runtime_installs_debians_docker_io_on_a_testbed_host(fake, plan):
    cp = plan()
    hp = cp.host("m3tb-02")
    run = fake(deploy_runtime, facts={facts.OsInfo: DEBIAN, facts.DockerInfo: facts.parse_docker(""), facts.GpuServices: {}},
               host_plan=hp, cluster_plan=cp)
    assert "Container runtime | Install the Docker engine" in run.names
    assert any("docker.io" in c for c in run.commands), run.commands
    assert not any("nvidia" in c for c in run.commands)


def test_images_load_the_archive_only_when_it_holds_another_id(fake, plan, tmp_path):
    archive(tmp_path, ID)
    cp = plan(f"m3_image_archive_dir={tmp_path}")
    hp = cp.host("m3tb-02")
    data = {"m3_image_archive_dir": str(tmp_path)}
    same = fake(deploy_images, facts={facts.DockerImage: lambda image: {"present": True, "id": ID, "digests": []}},
                host_plan=hp, cluster_plan=cp, host_data=data)
    assert same.ops == []
    moved = fake(deploy_images, facts={facts.DockerImage: lambda image: {"present": True, "id": "sha256:" + "cd" * 32,
                                                                   "digests": []}},
                 host_plan=hp, cluster_plan=cp, host_data=data)
    remote = f"/var/lib/m3/images/{image_archive_name(IMAGE)}"
    assert f"UPLOAD {remote}" in moved.commands
    assert f"docker load -i {remote}" in moved.commands
    assert not any(c.startswith("docker pull") for c in moved.commands)


def test_container_workers_run_the_plans_entrypoint_and_ship_no_sim_engine(fake, plan):
    cp = plan()
    hp = cp.host("m3tb-02")
    run = fake(deploy_workers, host_plan=hp, cluster_plan=cp)
    assert f"UPLOAD {SIM_ENGINE}" not in run.commands  # the stand-in image holds it
    worker = next(s for s in hp.services if s.kind == "worker")
    unit = next(o for o in run.ops if o.name.endswith("Render /etc/systemd/system/m3-worker@0.service"))
    text = next(iter(unit.uploads.values()))
    exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    assert f"--entrypoint {worker.argv[0]} {IMAGE} {worker.argv[1]}" in exec_start
    assert "User=root" in text and "Requires=docker.service" in text


def test_teardown_removes_the_containers_and_the_stand_in_image(fake, plan):
    cp = plan("m3_state=absent")
    hp = cp.host("m3tb-02")
    run = fake(teardown, host_plan=hp, cluster_plan=cp)
    stop = " ; ".join(next(o for o in run.ops if o.name.endswith("Stop and disable the m3 units")).commands)
    assert "docker rm -f m3-scripted m3-worker-0" in stop
    assert f"docker image rm -f {IMAGE}" in stop
