"""The last gate of a deploy: "listed" is not "serving" (Dynamo issue 2296). Runs once per cluster, on the
host that owns the endpoint (the first control host under Dynamo, the first worker standalone), from the controller:
the frontend's /health lists every planned worker (Dynamo), `/v1/models/{model}/ready` says ready, then one real
chat request is answered, and (Dynamo) one request pinned to each worker is answered by that worker.

Reads: cluster_plan() (endpoint, served_model_name, workers, serving); host_plan() (name).
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import python

from m3deploy.check import checks, readiness, rollout
from m3deploy.check.verify import contract
from m3deploy.controller import secrets
from m3deploy.core.errors import M3Error, plural
from m3deploy.deploy import context
from roles import lifecycle


def endpoint_owner(cp) -> str:
    ctl = cp.group("control") if cp.serving == "dynamo" else ()
    if ctl:
        return ctl[0].name
    return cp.workers[0].hosts[0] if cp.workers else ""


def one_request(endpoint: str, model: str, timeout_s: float, api_key: str | None = None) -> str:
    """POST one small chat completion (with the cluster's API key, when it has one); retry until answered or
    timeout. Returns what answered."""
    body = json.dumps({"model": model, "max_tokens": 8,
                       "messages": [{"role": "user", "content": "Say hello."}]}).encode()
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        req = urllib.request.Request(f"{endpoint}/chat/completions", data=body,
                                     headers={"Content-Type": "application/json", **readiness.auth(api_key)})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                doc = json.loads(resp.read())
            if doc.get("choices") and doc.get("usage", {}).get("completion_tokens", 0) > 0:
                return f"HTTP 200, {doc['usage']['completion_tokens']} completion tokens"
            last = f"HTTP 200 without choices/usage: {str(doc)[:200]}"
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}: {e.read(300).decode('utf-8', 'replace')}"
        except (urllib.error.URLError, OSError, ValueError) as e:
            last = str(getattr(e, "reason", e))
        if time.monotonic() >= deadline:
            raise M3Error(f"no answer to a chat request at {endpoint} (model {model!r}) after {timeout_s:.0f} s: "
                          f"{last}. Fix: m3deploy verify for the details; journalctl -u m3-frontend / m3-worker@N")
        time.sleep(1)


def _serving(cp):
    if cp.serving == "dynamo":
        fe = next(s for h in cp.hosts for s in h.services if s.kind == "frontend")
        base = checks.frontend_url(cp, "")
        heads = {f"{h.name}/{s.name}": checks.metrics_url(h, s) for h, s in checks.instance_services(cp)}
        # each planned worker under the id of its running process: a count of entries passes with a dead or
        # replaced worker still listed (issue 12)
        took = rollout.wait_workers(checks.frontend_url(cp, "/health"), heads,
                                    timeout_s=fe.readiness.timeout_s if fe.readiness else 120)
        host.log(f"the frontend lists all {plural(len(cp.workers), 'worker')} ({took:.1f} s)")
        for model in contract.served_models(cp):  # listed is not routable: the frontend's own readiness
            took = readiness.wait_model_ready(base, model, timeout_s=fe.readiness.timeout_s if fe.readiness else 120)
            host.log(f"{model}: /v1/models/{{model}}/ready ({took:.1f} s)")
    host.log(f"{cp.endpoint}: {one_request(cp.endpoint, cp.served_model_name, 120, secrets.api_key(cp))}")
    if cp.serving == "dynamo":
        host.log(each_worker_answers(cp))


def _worker_ids(cp) -> dict[str, int]:
    """{"host/service": Dynamo instance id} of every planned worker with a system port, from its own /metrics."""
    out = {}
    for h, s in checks.instance_services(cp):
        url = checks.metrics_url(h, s)
        if not url:
            continue
        with urllib.request.urlopen(url, timeout=10) as resp:
            ids = list(checks.generate_requests(resp.read().decode("utf-8", "replace")))
        if not ids:
            raise M3Error(f"{h.name}/{s.name}: no Dynamo worker id in {url}. Fix: journalctl -u {s.unit} on {h.name}")
        out[f"{h.name}/{s.name}"] = int(ids[0], 16)
    return out


def each_worker_answers(cp, timeout_s: float = 60) -> str:
    """Listed is not routable: one real request pinned to each worker must be answered by that worker."""
    ids = _worker_ids(cp)
    got = readiness.answered_by_each(cp.endpoint, cp.served_model_name, ids, secrets.api_key(cp), timeout_s,
                                     pools=checks.worker_pools(cp))
    for key, wid in ids.items():
        if got[key] != wid:
            raise M3Error(f"a request pinned to {key} (instance {wid}) was answered by {got[key]} after {timeout_s} "
                          "s. Fix: m3deploy verify (smoke/routable); journalctl -u m3-frontend and the worker's unit")
    return f"each of the {plural(len(ids), 'worker')} answered a request routed to it"


@deploy("Check the cluster is serving")
def verify_serving():
    cp, hp = context.cluster_plan(), context.host_plan()
    if hp.name != endpoint_owner(cp):
        return
    # only when this run (re)started a service somewhere: a no-op re-run changes nothing (m3deploy verify checks)
    python.call(name=f"Frontend lists every worker and answers a request ({cp.endpoint})", function=_serving, cp=cp,
                _if=lifecycle.started_anything)
