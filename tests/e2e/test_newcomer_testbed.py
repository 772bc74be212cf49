"""End-to-end: a newcomer's own cluster from the README's steps alone (issue 36), as a non-root user with sudo.

The README's "Your own cluster" code blocks are the input, so the README and this test cannot drift: its
`inventories/mylab.py` block (1 control + 2 workers) and its two `group_data/mylab.py` blocks (the GPU cluster's,
validated offline; the testbed rehearsal's, deployed). Only what the README says to fill in is filled in: the
testbed's addresses into `ssh_hostname` (control first) and the testbed's name in its key paths. The testbed is made
with the README's own `m3deploy testbed up` options (`--sudo-user`: the user `m3admin` with passwordless sudo), so the
deploy logs in as `m3admin` and becomes root through pyinfra's `_sudo`; then the README's steps: validate, plan,
deploy, verify (0 failed, and its SSH checks saw what only root sees: ss's process names), re-run (nothing changes).

Its own testbed: name m3nc, subnet 10.185.0.0/24, 3 hosts. The files live in a temporary directory
(inventories/mylab.py and inventories/group_data/mylab.py: pyinfra and m3deploy read the group_data beside an
inventory file), the controller's store in a temporary M3DEPLOY_CONFIG; the commands run from the repository root
as a user runs them. Needs root and the testbed's tools; torn down afterwards (M3_E2E_KEEP=1 keeps it).
"""
from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest
import tbrun

from m3deploy.testbed import load_state

pytestmark = pytest.mark.e2e

NAME = "m3nc"
SUBNET = "10.185.0.0/24"
REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
README_NAME = "mylab"  # the cluster (and testbed) name the README's steps use


def python_blocks() -> dict[str, str]:
    """README's ```python blocks by their first line's comment (e.g. "# inventories/mylab.py: ...")."""
    out = {}
    for block in re.findall(r"```python\n(.*?)```", README, re.S):
        first = block.splitlines()[0]
        assert first.startswith("# "), f"a README python block without its file named first: {first!r}"
        out[first[2:].split(":")[0].strip()] = block
    return out


BLOCKS = python_blocks()
INVENTORY = BLOCKS[f"inventories/{README_NAME}.py"]
GROUP_DATA = BLOCKS[f"group_data/{README_NAME}.py"]
REHEARSAL = BLOCKS[f"group_data/{README_NAME}.py on the testbed (no GPUs)"]


def readme_testbed_up() -> tuple[int, tuple[str, ...]]:
    """(hosts, options) of the README's `m3deploy testbed up N --name mylab --OPTION...`."""
    m = re.search(r"`(m3deploy testbed up [^`]+)`", README)
    assert m, "the README does not say how to bring up the testbed rehearsal"
    argv = shlex.split(m.group(1))[3:]
    n = int(argv.pop(0))
    assert argv[argv.index("--name") + 1] == README_NAME
    del argv[argv.index("--name"):argv.index("--name") + 2]
    assert all(a.startswith("--") for a in argv), argv
    return n, tuple(a[2:] for a in argv)


HOSTS, OPTIONS = readme_testbed_up()
TB = tbrun.Testbed(NAME, SUBNET, HOSTS, options=OPTIONS, cli=True)


def _with_addresses(inventory: str, addresses: list[str]) -> str:
    """The README's inventory with its ssh_hostname values replaced, in order (control first), by `addresses`."""
    found = re.findall(r'"ssh_hostname": "([^"]+)"', inventory)
    assert len(found) == len(addresses), (found, addresses)
    for old, new in zip(found, addresses):
        inventory = inventory.replace(f'"ssh_hostname": "{old}"', f'"ssh_hostname": "{new}"', 1)
    return inventory


def test_the_readmes_inventory_is_one_control_and_two_workers_and_validates(tmp_path):
    ns: dict = {}
    exec(compile(INVENTORY, "README inventories/mylab.py", "exec"), ns)
    assert (len(ns["control"]), len(ns["workers"])) == (1, 2)
    (tmp_path / "inventories" / "group_data").mkdir(parents=True)
    inv = tmp_path / "inventories" / f"{README_NAME}.py"
    inv.write_text(INVENTORY)
    (tmp_path / "inventories" / "group_data" / f"{README_NAME}.py").write_text(GROUP_DATA)
    r = TB.m3deploy("validate", str(inv), env={**os.environ, "M3DEPLOY_CONFIG": str(tmp_path / "config")})
    assert r.returncode == 0 and "valid (3 hosts, 2 workers" in r.stdout, r.stdout + r.stderr


@pytest.fixture(scope="module")
def lab(tmp_path_factory, testbed_up):
    root = tmp_path_factory.mktemp("newcomer")
    (root / "inventories" / "group_data").mkdir(parents=True)
    inventory = root / "inventories" / f"{README_NAME}.py"
    env = {**os.environ, "M3DEPLOY_CONFIG": str(root / "config"), "PYTHONUNBUFFERED": "1"}
    with testbed_up(TB):
        state = load_state(NAME)
        inventory.write_text(_with_addresses(INVENTORY, [h["address"] for h in state["hosts"]]))
        rehearsal = REHEARSAL.replace(f"/var/lib/m3deploy/testbed/{README_NAME}/", f"{state['state_dir']}/")
        assert state["ssh"]["private_key"] in rehearsal and state["ssh"]["known_hosts"] in rehearsal
        (root / "inventories" / "group_data" / f"{README_NAME}.py").write_text(rehearsal)
        yield inventory, root / "config", env


def test_deploy_and_verify_as_the_sudo_user_then_a_rerun_changes_nothing(lab):
    inventory, config, env = lab
    assert 'ssh_user = "m3admin"' in REHEARSAL and "_sudo = True" in REHEARSAL
    v = TB.m3deploy("validate", str(inventory), env=env)
    assert v.returncode == 0, v.stdout + v.stderr
    p = TB.m3deploy("plan", str(inventory), env=env)
    assert p.returncode == 0 and f"# cluster {README_NAME}:" in p.stdout, p.stderr
    r = TB.deploy(inventory=str(inventory), timeout=1500, env=env)
    assert r.returncode == 0, r.stdout[-6000:]
    v = TB.verify("--json", inventory=str(inventory), timeout=600, env=env)
    doc = json.loads(v.stdout)
    failed = [c for c in doc["results"] if not c["ok"]]
    assert (v.returncode, doc["cluster"], doc["failed"]) == (0, README_NAME, 0), f"{failed}\n{v.stderr[-3000:]}"
    # verify's SSH checks ran under sudo: only root sees another user's process in `ss -p`
    etcd = next(c for c in doc["results"] if c["id"].endswith("/etcd/client") and c["id"].startswith("port/"))
    assert "(etcd,pid=" in etcd["evidence"] and "sudo sh -c" in etcd["reproduce"], etcd
    # the deploy logged in as m3admin (the record keeps how: `m3deploy prune` reaches the hosts the same way)
    record = json.loads((config / README_NAME / "deployed.json").read_text())
    assert {h: e["connect"].get("ssh_user") for h, e in record["hosts"].items()} == \
        {name: "m3admin" for name in re.findall(r'\("([\w-]+)", \{"ssh_hostname"', INVENTORY)}
    assert all(e["connect"].get("_sudo") is True for e in record["hosts"].values())
    again = TB.deploy(inventory=str(inventory), timeout=900, env=env)
    assert again.returncode == 0, again.stdout[-6000:]
    total = [line for line in again.stdout.splitlines() if line.strip().startswith("Grand total")]
    assert total and total[-1].split()[3] == "-", f"the re-run changed something: {total}"
