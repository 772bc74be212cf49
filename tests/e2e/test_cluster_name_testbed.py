"""End-to-end: a cluster named only by its inventory file (issue 22), as a new user makes one: inventories/testbed.py
copied to mylab.py without its `"m3_cluster": _name` line (the testbed names its cluster after itself), with its
group_data (which names none). `pyinfra -y .../mylab.py deploy.py` then
`m3deploy verify .../mylab.py` passes with 0 failed, and the controller's secrets store and deploy record are
`<M3DEPLOY_CONFIG>/mylab/`, not a `cluster` store that every such cluster would share.

Its own testbed: name m3ml, subnet 10.101.0.0/24, 3 hosts (1 control + 2 workers). The copies live in a temporary
directory (inventories/mylab.py, inventories/group_data/mylab.py: pyinfra and m3deploy both read the group_data
beside an inventory file); the deploy runs from the repository root as a user runs it. Needs root and the
testbed's tools; torn down afterwards (M3_E2E_KEEP=1 keeps it).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import tbrun

pytestmark = pytest.mark.e2e

NAME = "m3ml"
SUBNET = "10.101.0.0/24"
REPO = Path(__file__).resolve().parents[2]
TB = tbrun.Testbed(NAME, SUBNET, 3, {**os.environ, "M3_TESTBED": NAME, "M3_TESTBED_CONTROL": "1",
                                     "PYTHONUNBUFFERED": "1"}, cli=True)


@pytest.fixture(scope="module")
def lab(tmp_path_factory, testbed_up):
    root = tmp_path_factory.mktemp("mylab")
    (root / "inventories" / "group_data").mkdir(parents=True)
    inventory = root / "inventories" / "mylab.py"
    text = (REPO / "inventories" / "testbed.py").read_text()
    assert '"m3_cluster": _name,' in text  # the testbed names its cluster; a user's copy without that line does not
    inventory.write_text("".join(line for line in text.splitlines(keepends=True)
                                 if not line.strip().startswith('"m3_cluster"')))
    group_data = (REPO / "group_data" / "testbed.py").read_text()
    assert "m3_cluster" not in group_data
    (root / "inventories" / "group_data" / "mylab.py").write_text(group_data)
    config = root / "config"
    env = {**TB.env, "M3DEPLOY_CONFIG": str(config)}
    with testbed_up(TB):
        yield inventory, config, env


def test_deploy_then_verify_under_the_files_name(lab):
    inventory, config, env = lab
    r = TB.deploy(inventory=str(inventory), timeout=1500, env=env)
    assert r.returncode == 0, r.stdout[-6000:]
    v = TB.verify("--json", inventory=str(inventory), timeout=600, env=env)
    doc = json.loads(v.stdout)
    failed = [c for c in doc["results"] if not c["ok"]]
    assert (v.returncode, doc["cluster"], doc["failed"]) == (0, "mylab", 0), f"{failed}\n{v.stderr[-3000:]}"
    assert sorted(p.name for p in config.iterdir()) == ["mylab"]
    record = json.loads((config / "mylab" / "deployed.json").read_text())
    assert sorted(record["hosts"]) == [f"{NAME}-01", f"{NAME}-02", f"{NAME}-03"]
    assert (config / "mylab" / "secrets.json").stat().st_mode & 0o077 == 0
