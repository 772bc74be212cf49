"""End-to-end: the testbed under the mocker's other engines (`--data m3_mocker_engine_type=sglang|trtllm`: Dynamo
1.6.1's mocker simulates that engine's scheduler and KV cache, dynamo/mocker/args.py `--engine-type`). For each:
the user's deploy; `m3deploy verify`, whose smoke checks cover the router (session affinity, spread over workers)
and Dynamo's parsers (the reasoning split, a tool call); then KV-aware routing: one long prompt sent again and
again stays on one worker, which the router knows holds its blocks from the workers' KV events. Its own testbed
name and range (m3en, 10.102.0.0/24: 1 control + 2 workers), so no other testbed is touched. Keep it after the
run: M3_E2E_KEEP=1.
"""
from __future__ import annotations

import json
import os
import tempfile
import urllib.request

import pytest
import tbrun

from tbssh import ssh_to

pytestmark = pytest.mark.e2e

NAME, SUBNET = "m3en", "10.102.0.0/24"
INVENTORY = "inventories/testbed.py"
CACHE = tempfile.mkdtemp(prefix="m3-e2e-engines-cache-")
ENV = {**os.environ, "M3_TESTBED": NAME, "M3_TESTBED_CONTROL": "1", "M3DEPLOY_CACHE": CACHE,
       "M3DEPLOY_CONFIG": os.path.join(CACHE, "config")}
TB = tbrun.Testbed(NAME, SUBNET, 3, ENV, cli=True, scratch=(CACHE,))
ssh = ssh_to(NAME)


@pytest.fixture(scope="module")
def testbed(testbed_up):
    with testbed_up(TB):
        yield NAME


@pytest.mark.parametrize("engine_type", ["sglang", "trtllm"])
def test_deploy_and_verify_under_engine_type(testbed, engine_type):
    data = ["--data", f"m3_mocker_engine_type={engine_type}"]
    run = TB.deploy(*data, timeout=900)
    assert run.returncode == 0, run.stdout[-6000:]
    # the workers run the mocker as that engine
    for host in ("m3en-02", "m3en-03"):
        unit = ssh(host, "cat /etc/systemd/system/m3-worker@0.service").stdout
        assert f"--engine-type {engine_type}" in unit, unit
    res = TB.verify(*data, timeout=300, merge=True)
    assert res.returncode == 0, f"m3deploy verify exited {res.returncode}:\n{res.stdout[-8000:]}"
    # routing (session affinity/spread) and the parsers (reasoning split, a tool call) are verify's smoke checks
    for check in ("smoke/session-affinity", "smoke/session-spread", "smoke/reasoning-split", "smoke/tool-call"):
        assert check in res.stdout, f"{check} did not run:\n{res.stdout[-4000:]}"
    # KV events: the router learns each worker's cached blocks from them, so one long prompt sent again and again
    # (no session header) keeps landing on the worker that holds its prefix (nvext.worker_id, as smoke reads it)
    plan = json.loads(TB.m3deploy("plan", INVENTORY, "--json", *data, timeout=60, merge=True).stdout)
    prompt = " ".join(f"token{i}" for i in range(700))
    body = json.dumps({"model": plan["served_model_name"], "max_tokens": 4, "nvext": {"extra_fields": ["worker_id"]},
                       "messages": [{"role": "user", "content": prompt}]}).encode()
    workers = []
    for _ in range(6):
        req = urllib.request.Request(plan["endpoint"] + "/chat/completions", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            workers.append(((json.loads(r.read()).get("nvext") or {}).get("worker_id") or {}).get("decode_worker_id"))
    assert None not in workers and len(set(workers[1:])) == 1, workers
