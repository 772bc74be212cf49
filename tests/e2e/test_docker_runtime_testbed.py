"""End-to-end: the container path for real (`--data m3_runtime=docker`) on the local testbed.

Own testbed `m3dkr`, 10.92.0.0/24 (1 control + 2 workers), made with `testbed up --docker` (hosts that can run
dockerd, docs/TESTBED.md). The mocker workers and the scripted engine run as containers of the stand-in engine
image through the GPU workers' `docker run --entrypoint` line (m3deploy/core/build.py, templates/m3-worker@.service.j2).

The controller needs docker: the module starts its own dockerd on a private socket (DOCKER_HOST), with
`--iptables=false --bridge=none --ip-forward=false --ip-masq=false` so the machine's networking (the testbeds'
bridges) is left alone, and its own data root ($M3DEPLOY_CACHE/e2e-docker: cold in CI; else /var/lib/m3deploy/e2e-docker, kept, so the
stand-in image is built once per machine). The image is shipped the air-gapped way: `m3deploy save-images` -> `m3_image_archive_dir` -> `docker load`.

In order:
1. the stand-in declares vLLM's ENTRYPOINT: the same run without `--entrypoint` fails (vllm-project/vllm
   docker/Dockerfile, stage vllm-openai: `ENTRYPOINT ["vllm", "serve"]`), with it the venv's python runs;
2. save-images + cold deploy -> `m3deploy verify` passes (the record holds each container's image id);
3. a re-run changes nothing (pyinfra's Grand total: 0 changed) and restarts nothing;
4. a changed image under the same tag (rebuilt on the controller, saved again) restarts the container workers
   and no native service (etcd, NATS, frontend keep their MainPID); the record holds the new id;
5. teardown removes the containers and the loaded stand-in image.

Keep the testbed after the run: M3_E2E_KEEP=1.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time

import pytest
import tbrun

from tbssh import ssh_to, state_dir

pytestmark = pytest.mark.e2e

NAME = "m3dkr"
SUBNET = "10.92.0.0/24"
CONTROL, W1, W2 = "m3dkr-01", "m3dkr-02", "m3dkr-03"
STATE_DIR = state_dir(NAME)
INVENTORY = "inventories/testbed.py"
IMAGE = "m3deploy/sim-engine:1.6.1"
VENV_PY = "/opt/m3/dynamo-1.6.1/bin/python"
# under the controller cache when one is given (CI: cold, so the stand-in image is built from nothing), else kept
# in /var/lib/m3deploy so a developer's re-run finds the image built
DOCKER_ROOT = os.path.join(os.environ.get("M3DEPLOY_CACHE") or "/var/lib/m3deploy", "e2e-docker")
DOCKER_RUN = "/run/m3deploy-e2e-docker"
DOCKER_HOST = f"unix://{DOCKER_RUN}/docker.sock"
ARCHIVES = f"{DOCKER_ROOT}-archives"
# the docker testbed's workers load the staged mock repos (target + mock EAGLE3 draft) from the HF cache
REPOS = ["--data", "m3_runtime=docker", "--data", "m3_weights_source=controller", "--data", "m3_mock_repo_mb=8"]
DATA = [*REPOS, "--data", f"m3_image_archive_dir={ARCHIVES}"]
CONFIG = f"/tmp/m3-e2e-{NAME}-config"
ENV = {**os.environ, "M3_TESTBED": NAME, "M3_TESTBED_CONTROL": "1", "DOCKER_HOST": DOCKER_HOST,
       "M3DEPLOY_CONFIG": CONFIG}
TB = tbrun.Testbed(NAME, SUBNET, 3, ENV, options=("docker",), cli=True, scratch=(CONFIG,))
TOTAL = re.compile(r"^\s{4}Grand total\s+(\d+|-)\s+(\d+|-)\s+(\d+|-)\s+(\d+|-)\s*$", re.M)
NATIVE = ("etcd", "nats", "m3-frontend")
CONTAINERS = {W1: ("m3-worker@0", "m3-scripted"), W2: ("m3-worker@0",)}


def _cli(*args, timeout=600, check=True):
    res = TB.m3deploy(*args, timeout=timeout)
    if check:
        assert res.returncode == 0, f"m3deploy {' '.join(args)} exited {res.returncode}:\n{res.stdout[-4000:]}" \
                                    f"\n{res.stderr[-3000:]}"
    return res


def docker(*args, check=True, timeout=600):
    res = subprocess.run(["docker", *args], env=ENV, capture_output=True, text=True, timeout=timeout)
    if check:
        assert res.returncode == 0, f"docker {' '.join(args)}: {res.stderr[-2000:]}"
    return res


def deploy(*extra) -> tuple[int, str, int]:
    """(exit code, output, changed ops from pyinfra's Grand total)."""
    res = TB.deploy(*DATA, *extra, timeout=590)
    m = TOTAL.search(res.stdout)
    assert res.returncode == 0 and m, f"deploy exited {res.returncode}:\n{res.stdout[-5000:]}"
    assert m[3] == "-", f"failed operations:\n{res.stdout[-5000:]}"
    return res.returncode, res.stdout, 0 if m[2] == "-" else int(m[2])


ssh = ssh_to(NAME)


def main_pids() -> dict[str, str]:
    out = {}
    for host, units in ((CONTROL, NATIVE), *CONTAINERS.items()):
        for u in units:
            out[f"{host}/{u}"] = ssh(host, f"systemctl show -p MainPID --value {u}").stdout.strip()
    return out


def recorded_ids() -> dict[str, str]:
    with open(f"{CONFIG}/{NAME}/deployed.json") as f:
        hosts = json.load(f)["hosts"]
    return {f"{h}/{c}": v["id"] for h in CONTAINERS for c, v in hosts[h]["running"]["containers"].items()}


@pytest.fixture(scope="module")
def controller_docker():
    if os.geteuid() != 0:
        pytest.fail("the testbed needs root")
    if not shutil.which("dockerd"):
        pytest.fail("dockerd missing on the controller: apt-get install docker.io (docs/TESTBED.md)")
    os.makedirs(DOCKER_RUN, exist_ok=True)
    log = open(f"{DOCKER_RUN}/dockerd.log", "ab")
    proc = subprocess.Popen(["dockerd", "--iptables=false", "--ip6tables=false", "--bridge=none",
                             "--ip-forward=false", "--ip-masq=false", "--data-root", DOCKER_ROOT,
                             "--exec-root", f"{DOCKER_RUN}/exec", "--pidfile", f"{DOCKER_RUN}/docker.pid",
                             "--host", DOCKER_HOST], stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    for _ in range(150):
        if docker("info", check=False).returncode == 0:
            break
        assert proc.poll() is None, open(f"{DOCKER_RUN}/dockerd.log").read()[-3000:]
        time.sleep(0.2)
    yield
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def testbed(controller_docker, testbed_up):
    with testbed_up(TB):
        shutil.rmtree(CONFIG, ignore_errors=True)  # a kept run's
        yield NAME


STEP: dict[str, object] = {}


def test_save_images_builds_the_stand_in_whose_entrypoint_is_vllms(testbed):
    t0 = time.monotonic()
    _cli("save-images", INVENTORY, ARCHIVES, *REPOS)
    STEP["save_s"] = time.monotonic() - t0
    cfg = json.loads(docker("image", "inspect", "--format", "{{json .Config}}", IMAGE).stdout)
    assert cfg["Entrypoint"] == ["vllm", "serve"] and cfg["WorkingDir"] == "/vllm-workspace"
    # the plan's argv after the image, without --entrypoint: `vllm serve <argv>` -> fails as on a GPU host
    bare = docker("run", "--rm", "--network", "none", IMAGE, VENV_PY, "-c", "print('ran')", check=False)
    assert bare.returncode != 0 and "ran" not in bare.stdout, bare
    assert "vllm" in bare.stderr
    ok = docker("run", "--rm", "--network", "none", "--entrypoint", VENV_PY, IMAGE, "-c",
                "import dynamo.mocker; print('ran')")
    assert ok.stdout.strip() == "ran"


def test_cold_deploy_runs_containers_and_verifies(testbed):
    t0 = time.monotonic()
    _, out, changed = deploy()
    STEP["cold_s"] = time.monotonic() - t0
    assert changed > 0
    for host, names in CONTAINERS.items():
        ps = ssh(host, "docker ps --format '{{.Names}} {{.Image}}'").stdout.split("\n")
        for name in names:
            assert f"{name.replace('@', '-')} {IMAGE}" in ps, ps
        unit = ssh(host, "cat /etc/systemd/system/m3-worker@0.service").stdout
        assert f"--entrypoint {VENV_PY} {IMAGE}" in unit, unit
        env = ssh(host, "cat /etc/m3/m3-worker@0.env").stdout
        assert "HF_HUB_OFFLINE=1" in env
        # the wrapper resolved both staged repos offline from the mounted HF cache (files/m3-sim-engine.py)
        log = ssh(host, "journalctl -u m3-worker@0 --no-pager -o cat").stdout
        assert "loaded target MiniMaxAI/" in log and "loaded draft m3deploy/mock-minimax-m3-eagle3@main" in log, log
    res = _cli("verify", INVENTORY, *DATA, check=False, timeout=300)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    assert all(v.startswith("sha256:") for v in recorded_ids().values()), recorded_ids()


def test_rerun_changes_and_restarts_nothing(testbed):
    before = main_pids()
    _, out, changed = deploy()
    assert changed == 0, out[-5000:]
    assert main_pids() == before


def test_changed_image_restarts_only_the_container_workers(testbed):
    before, ids = main_pids(), recorded_ids()
    old = docker("image", "inspect", "--format", "{{.Id}}", IMAGE).stdout.strip()
    # a rebuilt stand-in under the same tag (what a moved `:nightly` looks like to hosts): one more label
    build = subprocess.run(["docker", "build", "-q", "-t", IMAGE, "-"], env=ENV, capture_output=True, text=True,
                           input=f"FROM {IMAGE}\nLABEL io.m3deploy.e2e-rebuild={time.time_ns()}\n", timeout=300)
    assert build.returncode == 0, build.stderr
    new = docker("image", "inspect", "--format", "{{.Id}}", IMAGE).stdout.strip()
    assert new != old
    _cli("save-images", INVENTORY, ARCHIVES, *REPOS)
    t0 = time.monotonic()
    deploy()
    STEP["image_change_s"] = time.monotonic() - t0
    after = main_pids()
    for key in before:
        native = key.split("/", 1)[1] in NATIVE
        assert (after[key] == before[key]) == native, (key, before[key], after[key])
    assert set(recorded_ids().values()) == {new}, (ids, recorded_ids())
    _, out, changed = deploy()
    assert changed == 0, out[-5000:]


def test_teardown_removes_the_containers_and_the_loaded_image(testbed):
    deploy("--data", "m3_state=absent")
    for host in CONTAINERS:
        assert ssh(host, "docker ps -aq").stdout.strip() == ""
        assert ssh(host, f"docker image inspect {IMAGE} >/dev/null 2>&1 && echo present || echo gone").stdout.strip() \
            == "gone"
    print(f"\nfigures: {json.dumps({k: round(v, 1) for k, v in STEP.items()})}")
