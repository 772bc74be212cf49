"""The cluster's name is decided once (m3deploy.core.inventory.cluster_name): `m3_cluster` where set, else the
inventory file's name. Every command builds its plan through one loader (m3deploy.cli.load), so `plan`,
`validate`, `verify` and the deploy (tests/deploy/test_cluster_name_deploy.py) name a copied inventory alike: the
secrets store and the deploy record (~/.config/m3deploy/<name>/) follow it (issue 22)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from m3deploy.cli import load, main
from m3deploy.core import build as planmod
from m3deploy.core import inventory

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def mylab(tmp_path, monkeypatch):
    """inventories/h200.py copied to mylab.py, its group_data without the m3_cluster line, as a new user makes
    them (run from the repository, whose group_data/all.py etc. still apply)."""
    (tmp_path / "inventories").mkdir()
    (tmp_path / "group_data").mkdir()
    shutil.copy(ROOT / "inventories" / "h200.py", tmp_path / "inventories" / "mylab.py")
    text = (ROOT / "group_data" / "h200.py").read_text()
    assert "m3_cluster" in text
    (tmp_path / "group_data" / "mylab.py").write_text(
        "".join(line for line in text.splitlines(keepends=True) if not line.startswith("m3_cluster")))
    monkeypatch.chdir(ROOT)
    return tmp_path / "inventories" / "mylab.py"


def test_the_rule():
    hosts = inventory.hosts_from_dict({"workers": ["w1"]})
    assert inventory.cluster_name(hosts, "inventories/mylab.py") == "mylab"
    assert inventory.cluster_name(hosts, Path("/x/inventories/lab.b.py")) == "lab.b"  # pyinfra's file group
    assert inventory.cluster_name(hosts) == "cluster"
    named = inventory.hosts_from_dict({"workers": ["w1"]}, all_data={"m3_cluster": "prod"})
    assert inventory.cluster_name(named, "inventories/mylab.py") == "prod"


def test_a_copied_inventory_is_named_after_its_file(mylab):
    hosts, plan = load(str(mylab), facts=False)
    assert plan.name == "mylab"
    assert planmod.build(hosts, name=str(mylab)).name == "mylab"
    assert load(str(mylab), ["m3_cluster=lab2"], facts=False)[1].name == "lab2"


def test_plan_json_and_the_deploy_record_name_it_too(mylab, tmp_path, monkeypatch):
    monkeypatch.setenv("M3DEPLOY_CONFIG", str(tmp_path / "config"))
    r = CliRunner().invoke(main, ["plan", "--json", "--no-facts", str(mylab)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["name"] == "mylab"
    r = CliRunner().invoke(main, ["plan", "--diff-deployed", str(mylab)], catch_exceptions=False)
    assert f"no deploy record ({tmp_path / 'config' / 'mylab' / 'deployed.json'})" in r.output

