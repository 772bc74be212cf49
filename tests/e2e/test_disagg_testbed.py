"""End-to-end: disaggregated prefill/decode serving (m3_disagg, issue 23) on its own testbed, for real.

    python3 -m pytest -p no:cacheprovider -m e2e tests/e2e/test_disagg_testbed.py

Testbed `m3pd`, 10.120.0.0/24 (M3_DISAGG_TESTBED / M3_DISAGG_SUBNET move it): 1 control host (etcd, NATS, the
Dynamo frontend with the KV router) and 2 worker hosts. Deployed with inventories/testbed.py's documented line,
`--data 'm3_disagg={"prefill":{"workers":1},"decode":{"workers":1}}'`: Dynamo's mocker as a prefill worker
(`--disaggregation-mode prefill`, its bootstrap port) on the first worker host and as a decode worker on the second.
Then `m3deploy verify` passes, its disagg checks included: a request (and a streamed one) ran its prefill on the
prefill worker and its decode on the decode worker (the frontend's nvext names both, each one's /metrics counter
rose) and the frontend routes both pools by the KV router. M3_E2E_KEEP=1 keeps the testbed.
"""
from __future__ import annotations

import json
import os
import tempfile

import pytest
import tbrun

from m3deploy.testbed import core as testbed

pytestmark = pytest.mark.e2e

NAME = os.environ.get("M3_DISAGG_TESTBED", "m3pd")
SUBNET = os.environ.get("M3_DISAGG_SUBNET", "10.120.0.0/24")
CONFIG = tempfile.mkdtemp(prefix="m3-e2e-disagg-config-")
ENV = {**os.environ, "M3_TESTBED": NAME, "M3_TESTBED_CONTROL": "1", "M3DEPLOY_CONFIG": CONFIG}
POOLS = {"prefill": {"workers": 1}, "decode": {"workers": 1}}
DATA = ("--data", "m3_disagg=" + json.dumps(POOLS, separators=(",", ":")))
TB = tbrun.Testbed(NAME, SUBNET, 3, ENV, scratch=(CONFIG,))
on = TB.on


@pytest.fixture(scope="module")
def cluster(testbed_up):
    with testbed_up(TB, deploy=DATA, timeout=1200) as up:
        assert "answered a request routed to it" in up.deploy.stdout, up.deploy.stdout[-3000:]
        yield up.deploy.stdout


def test_pools_run_on_separate_hosts(cluster):
    hosts = [h["name"] for h in testbed.load_state(NAME)["hosts"]]
    modes = {}
    for h in hosts[1:3]:
        cmd = on(h, "systemctl show -p ExecStart --value m3-worker@0.service")
        modes[h] = cmd.split("--disaggregation-mode ", 1)[1].split()[0] if "--disaggregation-mode" in cmd else ""
    assert modes == {hosts[1]: "prefill", hosts[2]: "decode"}, modes
    assert "--bootstrap-ports" in on(hosts[1], "systemctl show -p ExecStart --value m3-worker@0.service")


def test_verify_passes_with_the_disagg_checks(cluster):
    res = TB.verify(*DATA, "--json", timeout=600)
    assert res.returncode == 0, (res.stdout[-4000:], res.stderr[-2000:])
    results = {r["id"]: r for r in json.loads(res.stdout)["results"]}
    for cid in ("disagg/instances", "disagg/request", "disagg/stream", "disagg/kv-router", "smoke/routable"):
        assert results[cid]["ok"] is True, (cid, results.get(cid))
    hosts = [h["name"] for h in testbed.load_state(NAME)["hosts"]]
    ev = results["disagg/stream"]["evidence"]
    assert f"prefill on {hosts[1]}/m3-worker@0" in ev and f"decode on {hosts[2]}/m3-worker@0" in ev, ev
