"""The deploy record (~/.config/m3deploy/<cluster>/deployed.json): the probe hosts run, parsed; the record written
by hosts at once; `m3deploy plan --diff-deployed` and verify's deployed/HOST against it."""
from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from m3deploy.check import verify
from m3deploy.cli import load_plan, main
from m3deploy.controller import deployed
from m3deploy.facts.deployed import parse_probe, probe_command
from tests.unit.test_plan_snapshots import ROOT

FIX = ROOT / "tests" / "fixtures"
INV = str(ROOT / "inventories" / "b200.py")
DIGEST = "vllm/vllm-openai@sha256:" + "c" * 64
IMAGE_ID = "sha256:" + "d" * 64
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(autouse=True)
def _config(tmp_path, monkeypatch):
    monkeypatch.setenv("M3DEPLOY_CONFIG", str(tmp_path / "config"))


def _fake_host(tmp_path: Path) -> dict:
    """A host's /proc, nvidia-smi and docker as the probe reads them: real H200 outputs from the fixtures, and a
    `docker` on PATH that answers like Docker 20.10 (a test seam here, not in the product)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    smi_text = (FIX / "h200x2-device" / "nvidia-smi.txt").read_text()
    (bin_ / "nvidia-smi").write_text(f"#!/bin/sh\ncat <<'EOF'\n{smi_text}EOF\n")
    (bin_ / "docker").write_text(
        "#!/bin/sh\n"
        'if [ "$1" = inspect ]; then [ "$4" = m3-worker-0 ] && echo ' + IMAGE_ID + ' && exit 0; exit 1; fi\n'
        'if [ "$1 $2" = "image inspect" ]; then [ "$5" = ' + IMAGE_ID + ' ] && echo "' + IMAGE_ID + '|' + DIGEST
        + '|<no value>" && exit 0; exit 1; fi\nexit 2\n')
    for f in ("nvidia-smi", "docker"):
        os.chmod(bin_ / f, 0o755)
    hub = tmp_path / "hub"
    ref = hub / "models--nvidia--MiniMax-M3-NVFP4" / "refs"
    ref.mkdir(parents=True)
    (ref / "main").write_text(COMMIT)
    return {"PATH": f"{bin_}:{os.environ['PATH']}", "hub": str(hub)}


def test_probe_runs_and_parses(tmp_path):
    env = _fake_host(tmp_path)
    cmd = probe_command({"m3-worker@0": "vllm/vllm-openai:minimax-m3", "m3-worker@1": "x:y"},
                        ["nvidia/MiniMax-M3-NVFP4", "Inferact/MiniMax-M3-EAGLE3"], hub=env["hub"])
    p = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=30, env={"PATH": env["PATH"]})
    assert p.returncode == 0, p.stderr
    got = parse_probe(p.stdout)
    assert got["containers"]["m3-worker@0"] == {"id": IMAGE_ID, "digests": [DIGEST], "dynamo": ""}
    assert got["containers"]["m3-worker@1"]["id"] == ""  # not running
    assert got["repos"] == {"nvidia/MiniMax-M3-NVFP4": COMMIT, "Inferact/MiniMax-M3-EAGLE3": ""}
    assert got["cuda"] == "13.0"  # the H200 capture's nvidia-smi header


def test_parse_driver_and_rocm():
    text = ("=== m3 driver\nNVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build\n"
            "| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   CUDA Version: 13.0 |\n"
            "=== m3 rocm\n7.2.0-43\n=== m3 dynamo\n1.6.1\n")
    got = parse_probe(text)
    assert (got["driver"], got["flavor"], got["cuda"], got["rocm"], got["dynamo"]) == (
        "580.159.04", "open", "13.0", "7.2.0", "1.6.1")


def _running(plan, hp):
    return {"driver": "580.159.04", "cuda": "13.0", "rocm": "", "dynamo": "",
            "containers": {s.name: {"id": IMAGE_ID, "digests": [DIGEST], "dynamo": ""} for s in hp.services
                           if s.image},
            "repos": {r.repo: COMMIT for r in plan.model_repos}}


def test_hosts_write_the_record_at_once_and_diff_is_empty():
    plan = load_plan(INV, [], facts=False)
    threads = [threading.Thread(target=deployed.write_host, args=(plan, hp, _running(plan, hp))) for hp in plan.hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    record = deployed.load(plan.name)
    assert set(record["hosts"]) == {h.name for h in plan.hosts}
    assert deployed.diff(plan, record) == []
    hp = next(h for h in plan.hosts if h.services)
    assert DIGEST in deployed.describe_running(record["hosts"][hp.name])
    check = next(c for c in verify.controller_checks(plan) if c.id == f"deployed/{hp.name}")
    r = verify.run_check(check, None)
    assert r.ok and DIGEST in r.evidence and f"nvidia/MiniMax-M3-NVFP4@{COMMIT[:12]}" in r.evidence


def test_diff_names_what_a_deploy_would_change():
    plan = load_plan(INV, [], facts=False)
    hp = next(h for h in plan.hosts if h.services)
    deployed.write_host(plan, hp, _running(plan, hp))
    changed = load_plan(INV, ['m3_max_model_len=65536', 'm3_image="vllm/vllm-openai:v0.12"'], facts=False)
    lines = deployed.diff(changed, deployed.load(plan.name))
    assert f"{hp.name}: ~ m3-worker@0 image vllm/vllm-openai:v0.31.0 -> vllm/vllm-openai:v0.12 (restart)" in lines
    assert any(x.endswith("not deployed yet") for x in lines)  # the other hosts
    check = next(c for c in verify.controller_checks(changed) if c.id == f"deployed/{hp.name}")
    r = verify.run_check(check, None)
    assert not r.ok and "deployed from another plan" in r.evidence and "--diff-deployed" in r.evidence


def test_cli_diff_deployed(tmp_path):
    runner = CliRunner()
    r = runner.invoke(main, ["plan", INV, "--no-facts", "--diff-deployed"])
    assert r.exit_code == 1 and "no deploy record" in r.output
    plan = load_plan(INV, [], facts=False)
    for hp in plan.hosts:
        deployed.write_host(plan, hp, _running(plan, hp))
    r = runner.invoke(main, ["plan", INV, "--no-facts", "--diff-deployed"])
    assert r.exit_code == 0 and "would change nothing" in r.output and DIGEST in r.output
    r = runner.invoke(main, ["plan", INV, "--no-facts", "--diff-deployed", "--data", "m3_max_model_len=65536"])
    assert r.exit_code == 1 and "command changes (restart)" in r.output and "65536" in r.output
    assert json.loads(deployed.record_path(plan.name).read_text())["version"] == deployed.VERSION
