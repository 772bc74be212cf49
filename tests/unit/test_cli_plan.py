"""`m3deploy plan` / `m3deploy validate` on every shipped inventory, as a user runs them."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from m3deploy.cli import main

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p.name for p in (ROOT / "inventories").glob("*.py") if p.stem != "testbed")


@pytest.fixture(autouse=True)
def _cwd(monkeypatch):
    monkeypatch.chdir(ROOT)


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_shipped_inventories_are_the_product_card_set():
    assert {"gb200.py", "h200.py", "b200.py", "mi300x.py", "mi355x.py", "mi355x_mxfp4.py"} <= set(SHIPPED)


@pytest.mark.parametrize("inv", SHIPPED)
def test_validate_every_shipped_inventory(inv):
    r = run("validate", f"inventories/{inv}")
    assert r.exit_code == 0, r.output
    assert "valid" in r.output


@pytest.mark.parametrize("inv", SHIPPED)
def test_plan_json_shape(inv):
    r = run("plan", f"inventories/{inv}", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["hosts"]
    for name, h in d["hosts"].items():
        for s in h["services"]:
            assert {"name", "argv", "env", "image", "command", "ports", "readiness"} <= set(s)
            assert isinstance(s["argv"], list) and isinstance(s["env"], dict)


@pytest.mark.parametrize("inv", SHIPPED)
def test_plan_is_deterministic(inv):
    a = run("plan", f"inventories/{inv}", "--json").output
    b = subprocess.run([sys.executable, "-m", "m3deploy.cli", "plan", f"inventories/{inv}", "--json"],
                       capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert a == b


def test_plan_text_is_copy_pasteable_shell():
    r = run("plan", "inventories/mi300x.py")
    assert r.exit_code == 0
    text = r.output
    assert "export VLLM_ROCM_USE_AITER=1" in text
    # the docker command re-joins to the same argv as the plan
    block = text[text.index("docker run"):].split("\n\n")[0]
    argv = shlex.split(block.replace("\\\n", " "))
    d = json.loads(run("plan", "inventories/mi300x.py", "--json").output)
    assert argv == d["hosts"]["mi300x-01"]["services"][0]["command"]


def test_plan_host_filter_and_unknown_host():
    r = run("plan", "inventories/gb200.py", "--host", "gb200-r01-t02")
    assert r.exit_code == 0
    assert "## gb200-r01-t02" in r.output and "## gb200-ctl-01" not in r.output
    assert "--headless" in r.output and "--node-rank 1" in r.output
    r = run("plan", "inventories/gb200.py", "--host", "nope")
    assert r.exit_code == 2 and "--host nope: not in the inventory" in r.output


def test_plan_explain_names_layers():
    r = run("plan", "inventories/gb200.py", "--host", "gb200-r01-t01", "--explain")
    assert "platform:gb200:tp8-two-trays (m3deploy/core/data/layers/60-dynamo.yaml)" in r.output
    assert "plan:multi-host" in r.output


def test_validate_reports_every_problem_and_exits_2():
    r = run("validate", "inventories/h200.py", "--data", "m3_variant=nvfp4", "--data", "m3_features=[\"bogus\"]")
    assert r.exit_code == 2
    assert "2 problems" in r.output and "nvfp4 needs blackwell" in r.output and "'bogus'" in r.output


def test_missing_inventory_file():
    r = run("plan", "inventories/nope.py")
    assert r.exit_code != 0
