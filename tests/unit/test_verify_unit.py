"""Unit tests of the verify suite: no SSH, no network (checks run against fakes)."""
from __future__ import annotations

import json
import os
import stat
from types import SimpleNamespace

import pytest

from m3deploy.check import checks, verify
from m3deploy.check.verify import smoke
from m3deploy.core import build as planmod
from m3deploy.core import inventory
from m3deploy.core.build import InvHost


def _plan(n_workers=2, serving="dynamo", **extra):
    hosts = inventory.hosts_from_dict(
        {"control": [("c", {"m3_address": "10.0.0.1"})],
         "workers": [(f"w{i}", {"m3_address": f"10.0.0.{i + 1}"}) for i in range(1, n_workers + 1)]},
        all_data={"m3_platform": "sim", "m3_engine": "mocker", "m3_serving": serving, "m3_parallel": "tp1", **extra})
    return planmod.build(hosts, name="t")


# ------------------------------------------------------------------------------------------ ssh_config
def test_ssh_config_from_inventory_data(tmp_path):
    hosts = [InvHost("a", ("control",), {"ssh_hostname": "10.1.0.1", "ssh_user": "root", "ssh_key": "/k/id key",
                                         "ssh_known_hosts_file": "/k/known_hosts", "ssh_port": 2222}),
             InvHost("b", ("workers",), {})]
    text = checks.ssh_config_text(hosts, str(tmp_path))
    a = text.split("Host b")[0]
    for line in ("Host a", "HostName 10.1.0.1", "User root", "Port 2222", 'IdentityFile "/k/id key"',
                 "IdentitiesOnly yes", "UserKnownHostsFile /k/known_hosts", "StrictHostKeyChecking yes",
                 "ControlMaster auto", f"ControlPath {tmp_path}/%C", "ControlPersist 60s", "BatchMode yes"):
        assert f"\n{line}\n" in a or f"\n  {line}\n" in a, line
    b = text.split("Host b")[1]
    assert "HostName b" in b and "StrictHostKeyChecking yes" in b
    assert f"UserKnownHostsFile {os.path.expanduser('~/.ssh/known_hosts')}" in b
    assert "IdentityFile" not in b and "User " not in b


def test_write_ssh_config_is_private_and_removed():
    hosts = [InvHost("a", ("control",), {"ssh_hostname": "10.1.0.1"})]
    path, d = checks.write_ssh_config(hosts)
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
        assert f"ControlPath {d}/%C" in open(path).read()
    finally:
        ctx = verify.Context(_plan(1), hosts)
        ctx._ssh_config, ctx._dir = path, d
        ctx.close()
    assert not os.path.exists(d)


def test_ssh_command_for_reproduction():
    h = InvHost("a", (), {"ssh_hostname": "10.1.0.1", "ssh_user": "root", "ssh_key": "/k/id",
                          "ssh_known_hosts_file": "/k/kh"})
    cmd = verify.ssh_command(h, "systemctl status etcd.service")
    assert cmd == ("ssh -i /k/id -o UserKnownHostsFile=/k/kh -o StrictHostKeyChecking=yes root@10.1.0.1 "
                   "'systemctl status etcd.service'")


# ------------------------------------------------------------------------------------------ parsers
SS = """\
LISTEN 0      4096   10.0.0.1:2379   0.0.0.0:* users:(("etcd",pid=9434,fd=8))
LISTEN 0      128    0.0.0.0:22      0.0.0.0:* users:(("sshd",pid=1,fd=3))
LISTEN 0      128    [::]:22         [::]:*    users:(("sshd",pid=1,fd=4))
LISTEN 0      4096   *:8000          *:*
LISTEN 0      4096   127.0.0.53%lo:53 0.0.0.0:*
LISTEN 0      4096   [::1]:631       [::]:*
"""


def test_parse_ss():
    ls = checks.parse_ss("State Recv-Q Send-Q Local Address:Port Peer Address:Port Process\n" + SS)
    assert checks.Listener("10.0.0.1", 2379, "etcd,pid=9434") in ls
    assert checks.Listener("::", 22, "sshd,pid=1") in ls
    assert checks.Listener("0.0.0.0", 8000, "") in ls
    assert checks.Listener("127.0.0.53", 53, "") in ls
    assert checks.Listener("::1", 631, "") in ls
    assert len(ls) == 6


HEALTH = {
    "status": "healthy",
    "instances": [
        {"component": "backend", "endpoint": "generate", "namespace": "dynamo", "instance_id": 2165565299337740553,
         "transport": {"tcp": "10.0.0.2:43281/1e0da22a84f04109/dynamo/backend/generate"}},
        {"component": "backend", "endpoint": "generate", "namespace": "dynamo", "instance_id": 7,
         "transport": {"tcp": "10.0.0.3:34197/7/dynamo/backend/generate"}},
        {"component": "scripted", "endpoint": "generate", "namespace": "dynamo", "instance_id": 9,
         "transport": {"tcp": "10.0.0.2:40001/9/dynamo/scripted/generate"}},
        {"component": "backend", "endpoint": "worker_kv_query_source_1b60", "namespace": "dynamo",
         "instance_id": 7, "transport": {"tcp": "10.0.0.3:34197/7/dynamo/backend/worker_kv_query_source_1b60"}},
    ],
}


def test_health_generate_instances_and_addresses():
    inst = verify.generate_instances(HEALTH)
    assert [i["instance_id"] for i in inst] == [2165565299337740553, 7, 9]
    assert [verify.instance_address(i) for i in inst] == ["10.0.0.2", "10.0.0.3", "10.0.0.2"]
    assert verify.instance_address({"transport": {"nats_tcp": "nats://10.0.0.9:4222/x"}}) == "10.0.0.9"
    assert checks.worker_id_hex(2165565299337740553) == "1e0da22a84f04109"


METRICS = """\
# HELP dynamo_component_requests_total Total requests
# TYPE dynamo_component_requests_total counter
dynamo_component_requests_total{dynamo_component="backend",dynamo_endpoint="generate",dynamo_namespace="dynamo",worker_id="1e0da22a84f04109"} 12
dynamo_component_requests_total{dynamo_component="backend",dynamo_endpoint="worker_kv_query_source_1e",dynamo_namespace="dynamo",worker_id="1e0da22a84f04109"} 1
dynamo_component_request_duration_seconds_bucket{dynamo_endpoint="generate",worker_id="1e0da22a84f04109",le="0.005"} 3
dynamo_component_uptime_seconds{worker_id="1e0da22a84f04109"} 28.9
dynamo_engine_request 0
weird{a="x\\"y, z",b="2"} 1.5e3
"""


def test_parse_prometheus_and_generate_requests():
    samples = checks.parse_prometheus(METRICS)
    assert ("dynamo_engine_request", {}, 0.0) in samples
    assert ("weird", {"a": 'x"y, z', "b": "2"}, 1500.0) in samples
    assert checks.generate_requests(METRICS) == {"1e0da22a84f04109": 12.0}


def test_deltas():
    assert smoke.deltas({"a": 3, "b": 5}, {"a": 7, "b": 5}) == {"a": 4, "b": 0}


# ------------------------------------------------------------------------------------------ checks from the plan
def test_checks_generated_from_plan():
    p = _plan(2)
    inv = [InvHost(h.name, h.groups, {"ssh_hostname": h.address}) for h in p.hosts]
    ids = [c.id for c in verify.all_checks(p, inv, smoke=True)]
    for want in ("unit/c/etcd", "unit/c/nats", "unit/c/m3-frontend", "unit/w1/m3-worker@0",
                 "port/c/etcd/client", "port/c/nats/monitor", "port/w2/m3-worker@0/system",
                 "file/c/m3-frontend", "file/w1/m3-worker@0", "health/c/etcd", "health/c/nats",
                 "health/w2/m3-worker@0", "instances/c/m3-frontend", "smoke/models", "smoke/session-affinity",
                 "smoke/session-spread", "smoke/unknown-model-404"):
        assert want in ids, want
    assert len(ids) == len(set(ids))
    only = [c for c in verify.all_checks(p, inv, only_host="w1", smoke=False)]
    assert {c.target for c in only} == {"w1"}
    with pytest.raises(verify.M3Error, match="no such host"):
        verify.all_checks(p, inv, only_host="nope")


def test_single_worker_has_no_spread_check():
    ids = [c.id for c in smoke.smoke_checks(_plan(1))]
    assert "smoke/session-affinity" in ids and "smoke/session-spread" not in ids


class FakeHost:
    def __init__(self, outputs):
        self.outputs = outputs

    def run(self, cmd):
        for key, (rc, out) in self.outputs.items():
            if key in cmd:
                return SimpleNamespace(rc=rc, stdout=out, stderr="" if rc == 0 else out)
        return SimpleNamespace(rc=1, stdout="", stderr="unexpected command " + cmd)


def _ctx(p, outputs_by_host):
    ctx = verify.Context(p, [InvHost(h.name, h.groups, {}) for h in p.hosts])
    ctx._hosts = {n: FakeHost(o) for n, o in outputs_by_host.items()}
    ctx._ssh_config = "/nonexistent"
    return ctx


def _by_id(checks, cid):
    return next(c for c in checks if c.id == cid)


def test_unit_port_file_checks_against_fake_host():
    p = _plan(1)
    good = {
        "systemctl show": (0, "LoadState=loaded\nActiveState=active\nSubState=running\nUnitFileState=enabled\nNRestarts=0\n"),
        "ss -Hltnp": (0, 'LISTEN 0 4096 10.0.0.1:2379 0.0.0.0:* users:(("etcd",pid=5,fd=8))\n'
                         'LISTEN 0 4096 0.0.0.0:2380 0.0.0.0:* users:(("etcd",pid=5,fd=9))\n'),
        "stat -c": (0, "600 root root regular file\n"),
    }
    checks = verify.host_checks(p)
    ctx = _ctx(p, {"c": good})
    r = verify.run_check(_by_id(checks, "unit/c/etcd"), ctx)
    assert r.ok and r.evidence == "loaded, active (running), enabled"
    r = verify.run_check(_by_id(checks, "port/c/etcd/client"), ctx)
    assert r.ok and "10.0.0.1:2379 (etcd,pid=5)" in r.evidence
    r = verify.run_check(_by_id(checks, "port/c/etcd/peer"), ctx)  # planned 10.0.0.1, bound 0.0.0.0
    assert not r.ok and "wildcard" in r.evidence
    r = verify.run_check(_by_id(checks, "port/c/nats/client"), ctx)
    assert not r.ok and "nothing listens on 10.0.0.1:4222" in r.evidence
    r = verify.run_check(_by_id(checks, "file/c/etcd"), ctx)
    assert r.ok and "mode 600 root:root" in r.evidence

    bad = dict(good, **{"systemctl show": (0, "LoadState=loaded\nActiveState=failed\nSubState=failed\n"
                                              "UnitFileState=disabled\nNRestarts=5\n"),
                        "journalctl": (0, "boom: address in use\n"),
                        "stat -c": (0, "644 m3 m3 regular file\n")})
    ctx = _ctx(p, {"c": bad})
    r = verify.run_check(_by_id(checks, "unit/c/etcd"), ctx)
    assert not r.ok and "failed (failed), disabled, restarted 5x" in r.evidence and "address in use" in r.evidence
    r = verify.run_check(_by_id(checks, "file/c/etcd"), ctx)
    assert not r.ok and "mode 644 m3:m3" in r.evidence


def _http(ctx, table):
    ctx.http_get = lambda url, timeout=None: table[url]


def test_health_and_instances_checks():
    p = _plan(2)
    checks = verify.controller_checks(p)
    ctx = verify.Context(p)
    _http(ctx, {"http://10.0.0.1:2379/health": (200, '{"health":"true","reason":""}'),
                "http://10.0.0.1:8000/health": (200, json.dumps(HEALTH))})
    r = verify.run_check(_by_id(checks, "health/c/etcd"), ctx)
    assert r.ok and "health=true" in r.evidence
    r = verify.run_check(_by_id(checks, "instances/c/m3-frontend"), ctx)
    assert r.ok and r.evidence.startswith("3 of 3 generate instance(s)")  # 2 mockers + the scripted engine
    half = dict(HEALTH, instances=HEALTH["instances"][:1])
    _http(ctx, {"http://10.0.0.1:2379/health": (200, '{"health":"false"}'),
                "http://10.0.0.1:8000/health": (200, json.dumps(half))})
    r = verify.run_check(_by_id(checks, "health/c/etcd"), ctx)
    assert not r.ok and "health='false'" in r.evidence
    r = verify.run_check(_by_id(checks, "instances/c/m3-frontend"), ctx)
    assert not r.ok and "1 of 3" in r.evidence and "10.0.0.3 (w2) x1" in r.evidence.split("missing on")[1]


def test_a_health_endpoint_that_recovers_within_its_tries_passes_and_says_so(monkeypatch):
    """etcd's /health said `{"health":"false"}` once in CI right after a deploy (a read over its 1 s timeout): asked
    again 1 s later it is healthy. Every try failing is still a failure."""
    monkeypatch.setattr(verify, "HEALTH_RETRY_S", 0.01)
    p = _plan(2)
    check = _by_id(verify.controller_checks(p), "health/c/etcd")
    ctx = verify.Context(p)
    answers = iter([(503, '{"health":"false"}'), (200, '{"health":"true","reason":""}')])
    ctx.http_get = lambda url, timeout=None: next(answers)
    r = verify.run_check(check, ctx)
    assert r.ok and "health=true (try 2 of 3; before: GET http://10.0.0.1:2379/health: HTTP 503" in r.evidence
    _http(ctx, {"http://10.0.0.1:2379/health": (503, '{"health":"false"}')})
    r = verify.run_check(check, ctx)
    assert not r.ok and "HTTP 503 (want 200)" in r.evidence and "(3 tries, 0.01 s apart)" in r.evidence


def test_crashing_check_is_a_failure_with_reason():
    c = verify.Check("x/y", "unit", "h", "t", fn=lambda ctx: 1 / 0, reproduce="echo")
    r = verify.run_check(c, verify.Context(_plan(1)))
    assert not r.ok and r.evidence.startswith("ZeroDivisionError")


# ------------------------------------------------------------------------------------------ report
def _results():
    return [verify.Result("unit/c/etcd", "unit", "c", "etcd.service active and enabled", True,
                          "loaded, active (running), enabled", "ssh c systemctl status", 0.1),
            verify.Result("smoke/tools", "smoke", "frontend", "tools [x] accepted", False,
                          "HTTP 400: tools=[get_weather] rejected", "curl -sS http://x/v1/chat/completions", 0.2)]


def test_report_text_lists_checks_evidence_and_reproduction():
    text = verify.render_text(_results(), seconds=1.25, notes=["one worker"])
    assert "unit/c/etcd" in text and "PASS" in text and "FAIL" in text
    assert "tools=[get_weather] rejected" in text  # rich markup escaped, not eaten
    assert "curl -sS http://x/v1/chat/completions" in text
    assert "ssh c systemctl status" not in text  # reproduction only for failures
    assert "note: one worker" in text and "1 passed, 1 failed in 1.2 s" in text


def test_json_document():
    doc = verify.to_json(_plan(1), _results(), 1.0, ["n"])
    assert doc["ok"] is False and doc["passed"] == 1 and doc["failed"] == 1
    assert doc["results"][1]["reproduce"].startswith("curl")
    json.dumps(doc)


def test_cli_exit_codes(monkeypatch, tmp_path):
    from click.testing import CliRunner

    p = _plan(1)
    from m3deploy.cli.verify import verify as verify_cmd

    monkeypatch.setattr(inventory, "load_inventory", lambda path, override_data=None: [])
    monkeypatch.setattr(planmod, "build", lambda inv, name=None, facts=None: p)
    results = _results()
    monkeypatch.setattr(verify, "run_checks", lambda checks, ctx: results)
    monkeypatch.setenv("M3DEPLOY_CONFIG", str(tmp_path / "config"))
    from m3deploy.controller import deployed

    deployed.write_host(p, p.hosts[0], {})  # a deployed cluster (tests/unit/test_verify_first.py: one that is not)
    out = tmp_path / "r.json"
    res = CliRunner().invoke(verify_cmd, ["inv.py", "--skip-smoke", "--json", "--report", str(out)])
    assert res.exit_code == 1, res.output
    assert json.loads(res.output)["failed"] == 1 and json.loads(out.read_text())["passed"] == 1
    results[:] = results[:1]
    res = CliRunner().invoke(verify_cmd, ["inv.py", "--skip-smoke", "--report", str(tmp_path / "r.txt")])
    assert res.exit_code == 0, res.output
    assert "1 passed, 0 failed" in (tmp_path / "r.txt").read_text()


def test_verify_suite_not_in_default_testpaths(pytestconfig):
    # pytest's own reading of pyproject.toml (tomllib is 3.11+; m3deploy supports 3.10)
    testpaths = pytestconfig.getini("testpaths")
    assert "tests/unit" in testpaths and "tests/verify" not in testpaths


def test_mpi_world_key_files_are_checked_0600_and_config_files_for_leaks():
    """A TensorRT-LLM worker over two trays (one MPI world): verify checks each SSH key file 0600 root:root and
    the plain config files (hostfile, ssh/sshd configs) among the files no secret may appear in."""
    from pathlib import Path

    from m3deploy.cli import load_plan
    from m3deploy.core import mpi

    p = load_plan(str(Path(__file__).resolve().parents[2] / "inventories" / "gb200.py"), ["m3_engine=trtllm", "m3_serving=dynamo", 'm3_features=["text-only"]',
                                           "m3_variant=bf16", "m3_parallel=tp8-ep"], facts=False)
    checks = verify.host_checks(p)
    ids = {c.id for c in checks}
    paths = mpi.paths(0)
    for host, names in (("gb200-r01-t01", ("key", "known_hosts")), ("gb200-r01-t02", ("host_key", "authorized_keys"))):
        for n in names:
            assert f"file/{host}/m3-worker@0/{paths[n].rsplit('/', 1)[1]}" in ids
    assert "port/gb200-r01-t02/m3-worker@0/mpi-ssh" in ids and "secrets/gb200-r01-t02" in ids
    key = _by_id(checks, f"file/gb200-r01-t02/m3-worker@0/{paths['host_key'].rsplit('/', 1)[1]}")
    r = verify.run_check(key, _ctx(p, {"gb200-r01-t02": {"stat -c": (0, "644 root root regular file\n")}}))
    assert not r.ok and f"{paths['host_key']} mode 644 root:root" in r.evidence
