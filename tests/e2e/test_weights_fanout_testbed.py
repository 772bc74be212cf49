"""End-to-end: weights fan-out from the controller over a tree (roles/weights.py, docs/WEIGHTS.md) on a testbed of
its own: name m3wfan, subnet 10.93.0.0/24, 4 hosts (1 control + 3 workers: with m3_weights_fanout = 1 the tree
is controller -> w1 in round 1, then controller -> w2 and w1 -> w3 in round 2, so both transfer paths run:
the controller's push over the inventory's SSH and a host-to-host pull through `rrsync -ro`).

A mock repo (m3deploy.controller.mockrepos, 40 MB, 1 shard) is staged with benchmarks/weights_deploy.py (the
weights step of deploy.py alone: same plan, same role). Checked: every worker's copy complete against its index
(m3deploy.check.hfcache on the host) and bit-identical to the controller's; one op per round shared by every
worker; the transfer key and the authorized_keys entry gone afterwards; a re-run has no round op; a truncated
shard on one host (marker removed) is repaired by the next run, on that host only. Needs root, the testbed's
tools and rsync on the controller; ~2 minutes here (2 cores).
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest
import tbrun

from tbssh import apt_diagnostics, ssh_to, state_dir

pytestmark = pytest.mark.e2e

NAME = "m3wfan"
SUBNET = "10.93.0.0/24"
REPO = Path(__file__).resolve().parents[2]
STATE_DIR = state_dir(NAME)
MODEL = "MiniMaxAI/MiniMax-M3"  # group_data/testbed.py's model id: the repo the plan stages
FOLDER = "/var/lib/m3/hf/hub/models--MiniMaxAI--MiniMax-M3"
DATA = {"m3_weights_source": "controller", "m3_mock_repo_mb": 40, "m3_weights_fanout": 1}
WORKERS = [f"{NAME}-02", f"{NAME}-03", f"{NAME}-04"]
# Its own controller cache: the mock repo's `refs/main` names one size of MiniMaxAI/MiniMax-M3 at a time, and another
# e2e module beside this one (scripts/test_lanes.py) stages the same repo id at another m3_mock_repo_mb
CACHE = tempfile.mkdtemp(prefix="m3-e2e-wfan-cache-")
# unbuffered: on a timeout, the output shows which hosts had finished the op that stalled
ENV = {**os.environ, "M3_TESTBED": NAME, "M3DEPLOY_CACHE": CACHE, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
TB = tbrun.Testbed(NAME, SUBNET, 4, ENV, cli=True, scratch=(CACHE,))

ssh = ssh_to(NAME)


def deploy(config) -> str:
    data = [a for k, v in DATA.items() for a in ("--data", f"{k}={v}")]
    try:
        r = TB.deploy(*data, script="benchmarks/weights_deploy.py", timeout=600,
                      env={**ENV, "M3DEPLOY_CONFIG": str(config)})
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        pytest.fail(f"the deploy did not finish in 600 s:\n{partial[-4000:]}\n"
                    f"{apt_diagnostics(NAME, [f'{NAME}-01', *WORKERS])}")
    assert r.returncode == 0, r.stdout[-6000:]
    return r.stdout


def digests(host) -> dict[str, str]:
    out = ssh(host, f"cd {FOLDER}/snapshots/*/ && sha256sum *").stdout
    return {line.split()[1]: line.split()[0] for line in out.splitlines()}


@pytest.fixture(scope="module")
def testbed(tmp_path_factory, testbed_up):
    with testbed_up(TB):
        yield tmp_path_factory.mktemp("config")


def test_stage_over_the_tree_then_rerun_moves_nothing(testbed):
    from m3deploy.check import hfcache
    from m3deploy.controller import mockrepos

    out = deploy(testbed)
    # the schedule, and one op per round on every worker (pyinfra's results table: Hosts = 3)
    assert "round 1/2: @controller -> m3wfan-02\nround 2/2: @controller -> m3wfan-03; m3wfan-02 -> m3wfan-04" in out
    for i in (1, 2):
        row = next(line for line in out.splitlines() if f"Weights round {i}/2" in line and "  3  " in line)
        assert re.search(r"\s3\s+\d\s+-\s+\d", row), row
    assert "[m3wfan-04] round 2/2: MiniMaxAI/MiniMax-M3 from m3wfan-02: complete against its index" in out
    assert "[m3wfan-03] round 2/2: MiniMaxAI/MiniMax-M3 from the controller" in out

    local = mockrepos.make_repo(Path(CACHE) / "mock-hf" / "hub", MODEL, size_mb=40, shards=1)
    want = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in local.snapshot.iterdir()}
    for h in WORKERS:
        assert digests(h) == want, h  # bit-identical to the controller's copy, every file of the snapshot
        r = ssh(h, hfcache.remote_command("/var/lib/m3/hf/hub", [f"{MODEL}@main:target"]))
        assert hfcache.parse_output(r.stdout)[0]["ok"], r.stdout
        assert ssh(h, f"ls {FOLDER}/snapshots").stdout.split() == [local.commit]
        assert ssh(h, "grep -c m3deploy-weights /root/.ssh/authorized_keys", check=False).stdout.strip() == "0"
        assert ssh(h, "test -e /etc/m3/weights_transfer_key", check=False).returncode == 1

    again = deploy(testbed)
    assert "Weights round" not in again and "rsync" not in again  # nothing to do: no op at all

    # a truncated shard (an interrupted copy) on one host: the next run repairs that host only
    shard = "model-00001-of-00001.safetensors"
    ssh("m3wfan-03", f"truncate -s 1000000 {FOLDER}/snapshots/*/{shard} && rm /var/lib/m3/hf/.m3-complete-*")
    fixed = deploy(testbed)
    assert "round 1/1: @controller -> m3wfan-03\n" in fixed
    assert digests("m3wfan-03") == want
