"""group_data mistakes a new user makes (issue 36), caught by m3deploy.core.inventory for `m3deploy validate`
and the deploy alike (both load through it, nothing is changed on a host):

- group_data/h200.py copied to group_data/mylab.py keeps `m3_cluster = "h200"`: the new cluster would share h200's
  secrets store, CA and deploy record; refused, naming the file, the key and the fix;
- a group_data file named after no group of the inventory (group_data/mylab-h200.py) is silently ignored by
  pyinfra: the validation error that follows (a key not set) names it, with the fix.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from m3deploy.cli import main
from m3deploy.core import inventory
from m3deploy.core.errors import M3Error

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """A checkout's layout with the shipped h200 inventory beside the user's copy of it: inventories/{h200,mylab}.py,
    group_data/{all,h200}.py; the test writes group_data/mylab*.py."""
    for d in ("inventories", "group_data"):
        (tmp_path / d).mkdir()
    for f in ("inventories/h200.py", "inventories/mylab.py"):
        shutil.copy(ROOT / "inventories" / "h200.py", tmp_path / f)
    for f in ("all.py", "h200.py"):
        shutil.copy(ROOT / "group_data" / f, tmp_path / "group_data" / f)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("M3DEPLOY_CONFIG", str(tmp_path / "config"))
    return tmp_path


def _validate(*args):
    return CliRunner().invoke(main, ["validate", *args], catch_exceptions=False)


def test_a_copied_group_data_file_that_keeps_the_other_clusters_name_is_refused(lab):
    shutil.copy(lab / "group_data" / "h200.py", lab / "group_data" / "mylab.py")
    r = _validate("inventories/mylab.py")
    assert r.exit_code == 2, r.output
    for text in ("group_data/mylab.py", "key m3_cluster = 'h200'", "inventory h200's cluster",
                 "Fix: remove that line", "m3_cluster = 'mylab'"):
        assert text in r.stderr, (text, r.stderr)
    assert "Traceback" not in r.output
    # the shipped inventory itself, and the copy once fixed (or named on the command line), are fine
    assert _validate("inventories/h200.py").exit_code == 0
    assert _validate("inventories/mylab.py", "--data", "m3_cluster=mylab").exit_code == 0
    text = (lab / "group_data" / "mylab.py").read_text().replace('m3_cluster = "h200"', 'm3_cluster = "mylab"')
    (lab / "group_data" / "mylab.py").write_text(text)
    assert _validate("inventories/mylab.py").exit_code == 0


def test_the_deploy_refuses_it_too_before_any_host(lab):
    """pyinfra's run: m3deploy's loader (deploy.preload, from config.py) stops it before it connects."""
    shutil.copy(lab / "group_data" / "h200.py", lab / "group_data" / "mylab.py")
    with pytest.raises(M3Error, match="key m3_cluster = 'h200'"):
        inventory.load(lab / "inventories" / "mylab.py", cwd=str(lab))
    pyinfra = shutil.which("pyinfra", path=os.path.dirname(sys.executable)) or shutil.which("pyinfra")
    # pyinfra reads its working directory's group_data/ (the checkout's) and --group-data: the user's here
    r = subprocess.run([pyinfra, "-y", "--group-data", str(lab / "group_data"), str(lab / "inventories" / "mylab.py"),
                        "deploy.py"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "M3DEPLOY_CONFIG": str(lab / "config")})
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "nothing was changed" in out and "key m3_cluster = 'h200'" in out, out
    assert "Connecting to hosts" not in out and "Traceback" not in out, out


def test_all_py_naming_a_shipped_cluster_is_refused_for_every_other_inventory(lab):
    with open(lab / "group_data" / "all.py", "a") as f:
        f.write('m3_cluster = "h200"\n')
    shutil.copy(lab / "group_data" / "h200.py", lab / "group_data" / "mylab.py")
    text = (lab / "group_data" / "mylab.py").read_text().replace('m3_cluster = "h200"\n', "")
    (lab / "group_data" / "mylab.py").write_text(text)
    r = _validate("inventories/mylab.py")
    assert r.exit_code == 2 and "group_data/all.py: key m3_cluster = 'h200'" in r.stderr, r.stderr


def test_a_misnamed_group_data_file_is_named_in_the_error(lab):
    text = (lab / "group_data" / "h200.py").read_text().replace('m3_cluster = "h200"\n', "")
    (lab / "group_data" / "mylab-h200.py").write_text(text)
    r = _validate("inventories/mylab.py")
    assert r.exit_code == 2
    assert "key m3_platform is not set" in r.stderr, r.stderr
    assert "group_data/mylab-h200.py matches no group of inventories/mylab.py" in r.stderr, r.stderr
    assert f"Fix: name it after the group it is for, e.g. {lab / 'group_data' / 'mylab.py'}" in r.stderr
    assert "group_data/h200.py matches" not in r.stderr  # inventories/h200.py's file, not a mistake
    r = CliRunner().invoke(main, ["plan", "-v", "inventories/h200.py"], catch_exceptions=False)
    assert r.exit_code == 0 and "group_data/mylab-h200.py matches no group" in r.stderr  # -v says so always
    (lab / "group_data" / "mylab-h200.py").rename(lab / "group_data" / "mylab.py")
    assert _validate("inventories/mylab.py").exit_code == 0


def test_every_shipped_inventory_loads_with_the_shipped_group_data(monkeypatch):
    monkeypatch.chdir(ROOT)
    for inv in sorted((ROOT / "inventories").glob("*.py")):
        if inv.stem != "testbed":
            assert inventory.load_inventory(inv), inv
            assert inventory.unmatched_group_data(inv) == [], inv
