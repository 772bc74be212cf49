"""verify says first what it cannot check (issue 36): nothing deployed (one line naming the deploy record, at once),
and an endpoint that is not the deployed server (smoke/identity fails; no smoke check counts).

The wrong server is a real one: a tiny HTTP server on loopback that answers 404 to everything. That the identity
passes on Dynamo 1.6.1's own frontend is shown by tests/e2e/test_verify_loopback.py (its smoke checks open with
smoke/identity)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from m3deploy.check import verify
from m3deploy.check.verify import contract, identity, smoke
from m3deploy.controller import deployed
from m3deploy.core import build as planmod
from m3deploy.core import inventory

REPO = Path(__file__).resolve().parents[2]


def _m3deploy(*args, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "m3deploy.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


# ------------------------------------------------------------------------------------------ nothing deployed
def test_verify_of_a_cluster_never_deployed_says_so_in_one_line_at_once(tmp_path):
    t0 = time.monotonic()
    res = _m3deploy("verify", "inventories/h200.py", env={"M3DEPLOY_CONFIG": str(tmp_path)})
    took = time.monotonic() - t0
    record = tmp_path / "h200" / "deployed.json"
    assert res.returncode == 1, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and str(record) in lines[0] and "nothing deployed" in lines[0], res.stderr
    assert "pyinfra -y inventories/h200.py deploy.py" in lines[0]
    assert "Traceback" not in res.stdout + res.stderr and not res.stdout.strip()
    assert took < 20, f"took {took:.1f} s"
    res = _m3deploy("verify", "inventories/h200.py", "--json", env={"M3DEPLOY_CONFIG": str(tmp_path)})
    assert res.returncode == 1 and json.loads(res.stdout) == {"cluster": "h200", "ok": False,
                                                              "error": lines[0]}, res.stdout


def _plan(**extra):
    hosts = inventory.hosts_from_dict(
        {"control": [("c", {"m3_address": "127.0.0.1"})], "workers": [("w1", {"m3_address": "127.0.0.2"})]},
        all_data={"m3_platform": "sim", "m3_engine": "mocker", "m3_serving": "dynamo", "m3_parallel": "tp1",
                  "m3_auth": False, **extra})
    return planmod.build(hosts, name="t36v")


def test_a_record_of_other_hosts_is_named_and_a_recorded_host_lets_verify_run(tmp_path, monkeypatch):
    monkeypatch.setenv("M3DEPLOY_CONFIG", str(tmp_path))
    plan = _plan()
    assert "no deploy record" in verify.nothing_deployed(plan)
    other = _plan()
    deployed.write_host(other, other.host("c"), {})
    doc = deployed.load("t36v")
    doc["hosts"] = {"old-host": doc["hosts"]["c"]}
    deployed.record_path("t36v").write_text(json.dumps(doc))
    line = verify.nothing_deployed(plan)
    assert "has none of its hosts c, w1 (it has old-host)" in line, line
    deployed.write_host(plan, plan.host("w1"), {})
    assert verify.nothing_deployed(plan) == ""  # c's own deployed/c check says what is missing
    assert "has none of its hosts c" in verify.nothing_deployed(plan, only_host="c")


# ------------------------------------------------------------------------------------------ identity
class _Always404(BaseHTTPRequestHandler):
    def _answer(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = b'{"error": "not found"}'
        self.send_response(404)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *a):
        pass


@pytest.fixture
def server_404():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Always404)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def test_a_server_answering_404_to_everything_fails_verify_and_no_smoke_check_counts(server_404):
    plan = _plan(m3_frontend_port=server_404)
    assert plan.endpoint == f"http://127.0.0.1:{server_404}/v1"
    checks = smoke.smoke_checks(plan) + identity.gated(contract.contract_checks(plan))
    assert checks[0].id == identity.ID
    ctx = verify.Context(plan, request_timeout=5.0)
    try:
        results = verify.run_checks(checks, ctx)
    finally:
        ctx.close()
    by_id = {r.id: r for r in results}
    first = by_id[identity.ID]
    assert not first.ok and "HTTP 404" in first.evidence and "another server" in first.evidence, first.evidence
    passed = [r.id for r in results if r.ok]
    assert not passed, f"counted against a server that answers 404 to everything: {passed}"
    for r in results[1:]:
        assert r.evidence.startswith(f"not counted: {identity.ID} failed"), (r.id, r.evidence)
    assert {"smoke/unknown-model-404", "smoke/image-input"} <= set(by_id)
    text = verify.render_text(results)
    assert "smoke/identity" in text and "Traceback" not in text


def test_every_smoke_check_of_verify_is_gated_on_the_identity():
    plan = _plan()
    smoke_ids = [c.id for c in verify.all_checks(plan, smoke=True) if c.group == "smoke"]
    assert smoke_ids[0] == identity.ID and len(smoke_ids) > 10
    assert not [c.id for c in verify.all_checks(plan, smoke=False) if c.group == "smoke"]


def test_the_pytest_suite_says_nothing_deployed_in_one_line_too(tmp_path):
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/verify",
                          "--inventory", "inventories/h200.py"], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO), "M3DEPLOY_CONFIG": str(tmp_path)})
    assert res.returncode == 4, res.stdout + res.stderr  # pytest's usage error
    assert f"nothing deployed for cluster h200: no deploy record {tmp_path}/h200/deployed.json" in res.stderr
    assert "Traceback" not in res.stdout + res.stderr
