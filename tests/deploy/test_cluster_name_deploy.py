"""The deploy names the cluster as every command does (issue 22): `pyinfra -y inventories/mylab.py deploy.py`
without m3_cluster plans a cluster called `mylab`, whose secrets and deploy record go to
~/.config/m3deploy/mylab/, not to a `cluster` store shared with every other such cluster.

Run through pyinfra's own CLI, as a user runs it: config.py (m3deploy.deploy.preload) notes the inventory file
before pyinfra loads it, and the plan (m3deploy.deploy.context.cluster_plan) names the cluster after it. The
hosts are pyinfra's `@fake` ones and the deploy file only prints the plan's name (m3_state=absent: no controller
artifact is built), so nothing is connected to or changed.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = '''control = [("@fake/ctl", {"m3_address": "10.9.0.1"})]
workers = [("@fake/w1", {"m3_address": "10.9.0.2"}), ("@fake/w2", {"m3_address": "10.9.0.3"})]
'''
# the plan knows `@fake/<name>` as `<name>` (as tests/deploy/conftest.py does): a seam of this test only
PROBE = '''from m3deploy.deploy import context
context.plan_name = lambda h: h.name.rsplit("/", 1)[-1]
print("CLUSTER-NAME", context.cluster_plan().name, flush=True)
'''


@pytest.fixture
def lab(tmp_path):
    (tmp_path / "inventories").mkdir()
    (tmp_path / "group_data").mkdir()
    (tmp_path / "inventories" / "mylab.py").write_text(INVENTORY)
    text = (ROOT / "group_data" / "testbed.py").read_text()
    (tmp_path / "group_data" / "mylab.py").write_text(
        "".join(line for line in text.splitlines(keepends=True) if not line.startswith("m3_cluster")))
    shutil.copy(ROOT / "config.py", tmp_path / "config.py")
    (tmp_path / "probe.py").write_text(PROBE)
    return tmp_path


def _names(cwd: Path, *data: str) -> set[str]:
    args = [sys.executable, "-m", "pyinfra", "-y", "inventories/mylab.py", "probe.py", "--data", "m3_state=absent"]
    for d in data:
        args += ["--data", d]
    r = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120)
    names = {line.split()[1] for line in r.stdout.splitlines() if line.startswith("CLUSTER-NAME ")}
    assert r.returncode == 0 and names, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return names


def test_the_deploy_names_the_cluster_after_its_inventory_file(lab):
    assert _names(lab) == {"mylab"}


def test_m3_cluster_still_names_it(lab):
    assert _names(lab, "m3_cluster=lab2") == {"lab2"}
