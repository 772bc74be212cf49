"""Drills: a change of generation (issue 38) under load: Dynamo 1.6.0 -> 1.6.1 on every worker and frontend, and
the roll back.

    python3 -m pytest -p no:cacheprovider -m drills tests/e2e/test_drills_upgrade.py

Opt-in (`-m drills`). Testbed `m3up`, 10.189.0.0/24 (M3_UPGRADE_TESTBED / M3_UPGRADE_SUBNET move it): 1 control
host (etcd, NATS, 2 frontends behind the edge: drained frontend restarts) and 2 mocker workers, a private
controller config in a temporary directory. Deployed first with `m3_dynamo_version=1.6.0` (the ai-dynamo 1.6.0
wheels from PyPI, in the controller's wheelhouse like 1.6.1's), then in file order:

1. the upgrade: the deploy re-run with 1.6.1 (a new generation: new venv, both frontends restarted, drained at the
   edge, every worker rolled into namespace dynamo-<new id>), under load through the edge;
2. the roll back: the `--data` that `m3deploy plan --diff-deployed` prints, under load.
Each: 0 failed requests; a probe of every frontend's /health every 0.5 s that finds at least one `generate`
instance listed on each, at every probe; at least 5,000 requests. Figures: benchmarks/results/upgrade-<UTC>.md.
"""
from __future__ import annotations

import datetime
import json
import os
import tempfile
import threading
import time
import urllib.request

import pytest
import tbrun

from load import Load
from m3deploy.check.checks import frontend_urls

pytestmark = [pytest.mark.drills, pytest.mark.e2e]

NAME = os.environ.get("M3_UPGRADE_TESTBED", "m3up")
SUBNET = os.environ.get("M3_UPGRADE_SUBNET", "10.189.0.0/24")
CONFIG = tempfile.mkdtemp(prefix="m3-e2e-upgrade-config-")
KEY_FILE = os.path.join(CONFIG, "api.keys")
KEY = "m3k-upgrade-" + os.urandom(8).hex()
ENV = {**os.environ, "M3_TESTBED": NAME, "M3_TESTBED_CONTROL": "1", "M3DEPLOY_CONFIG": os.path.join(CONFIG, "m3")}
DATA = ("--data", "m3_edge=true", "--data", f"m3_api_key_file={KEY_FILE}")
OLD, NEW = "1.6.0", "1.6.1"
TB = tbrun.Testbed(NAME, SUBNET, 3, ENV, scratch=(CONFIG,))
STARTED = datetime.datetime.now(datetime.timezone.utc)
RESULTS: list[dict] = []
MIN_REQUESTS = 5000
# concurrent clients and tokens a request: measured on the kept testbed with nothing rolling (20 s each, 2026-12-07):
# 32 clients x 24 tokens 77 req/s, 64 x 24 85, 96 x 24 119, 96 x 16 129, 128 x 16 129 (the 2 cores are the bound)
CLIENTS, MAX_TOKENS = 96, 16


def version(v: str) -> tuple[str, ...]:
    return DATA + ("--data", f"m3_dynamo_version={v}")


def workers(doc: dict) -> list[dict]:
    """The planned workers' `generate` instances in a frontend's /health (component `backend`: the mocker; the
    scripted tool-call engine beside worker 0, component `scripted`, is not one of them)."""
    return [i for i in doc.get("instances") or [] if i.get("endpoint") == "generate" and i.get("component") == "backend"]


class Probe(threading.Thread):
    """Every 0.5 s, a round over every frontend's /health: the `generate` instances each lists. `fewest_routable`:
    the fewest, over the rounds, of the most any frontend listed in that round (what the edge can route to);
    `fewest_listed`: the fewest one answering frontend listed (a frontend restarted and not yet back at the edge
    may list none); `errors`: /health not answered (a frontend restarting)."""

    def __init__(self, urls: list[str]):
        super().__init__(daemon=True)
        self.urls, self.stop_at = urls, threading.Event()
        self.fewest_routable = self.fewest_listed = None
        self.rounds = self.errors = 0

    def run(self):
        while not self.stop_at.is_set():
            seen = []
            for url in self.urls:
                try:
                    doc = json.loads(urllib.request.urlopen(url, timeout=5).read())
                    seen.append(len(workers(doc)))
                except (OSError, ValueError):
                    self.errors += 1
            best = max(seen, default=0)
            self.fewest_routable = best if self.fewest_routable is None else min(self.fewest_routable, best)
            if seen:
                low = min(seen)
                self.fewest_listed = low if self.fewest_listed is None else min(self.fewest_listed, low)
            self.rounds += 1
            time.sleep(0.5)


@pytest.fixture(scope="module")
def cluster(testbed_up):
    fd = os.open(KEY_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(KEY + "\n")
    with testbed_up(TB, deploy=version(OLD), timeout=1500):
        p = TB.plan(version(OLD))
        ca = os.path.join(ENV["M3DEPLOY_CONFIG"], p.name, "ca.pem")
        try:
            yield p, ca
        finally:
            tbrun.write_results(
                "upgrade", STARTED, "Generation change under load (Dynamo 1.6.0 <-> 1.6.1)",
                "`python3 -m pytest -p no:cacheprovider -m drills tests/e2e/test_drills_upgrade.py` on the local "
                "testbed (one 2-core machine shared with other work; `load`: its 1-minute load average): 1 control "
                "host (etcd, NATS, 2 frontends behind HAProxy with TLS and an API key) and 2 mocker workers. Load: "
                f"tests/e2e/load.py through the edge, {CLIENTS} concurrent clients, at least {MIN_REQUESTS} requests a "
                "drill (the load runs on after the deploy until then), streaming and non-streaming chat, "
                f"max_tokens {MAX_TOKENS}, no retries. Probe: a round over every frontend's /health every 0.5 s (direct, not via the "
                "edge); `fewest routable`: over the rounds, the fewest of the most `generate` instances any frontend "
                "listed in a round; `fewest listed`: the fewest one answering frontend listed (a restarted frontend "
                "not yet back at the edge may list none); `not answered`: a frontend restarting.",
                ["drill", "sent", "ok", "failed", "took s", "failures", "notes"],
                [[r["drill"], r["stats"].sent, r["stats"].ok, r["stats"].failed, f"{r['took']:.1f}",
                  tbrun.failures(r["stats"], "x"), r["note"]] for r in RESULTS])


def change(p, ca, data: tuple[str, ...], name: str) -> None:
    target = TB.plan(data).generation
    probe = Probe(frontend_urls(p, "/health"))
    with Load(p.endpoint, p.served_model_name, concurrency=CLIENTS, max_tokens=MAX_TOKENS, duration_s=900, api_key=KEY, ca_file=ca,
              max_requests=60000, min_requests=MIN_REQUESTS) as load:
        probe.start()
        time.sleep(3)
        t0 = time.monotonic()
        run = TB.deploy(*data, timeout=1200)
        took = time.monotonic() - t0
        time.sleep(max(3.0, 60 - took))  # the load runs on after the deploy: at least 60 s in all
        stats = load.stop()  # and on until MIN_REQUESTS were sent
        probe.stop_at.set()
    probe.join(5)
    assert run.returncode == 0, run.stdout[-5000:]
    tbrun.record(RESULTS, name, stats, took,
                 f"probe rounds {probe.rounds}, fewest routable {probe.fewest_routable}, fewest listed by one "
                 f"answering frontend {probe.fewest_listed}, /health not answered {probe.errors}; "
                 f"to generation {target.id} (dynamo {target.dynamo_version}); {stats.sent / (stats.ended - stats.started):.0f} req/s over {stats.ended - stats.started:.0f} s")
    assert stats.failed == 0, stats.summary()
    assert stats.sent >= MIN_REQUESTS, stats.summary()
    assert probe.fewest_routable and probe.fewest_routable >= 1, (probe.fewest_routable, probe.rounds)
    assert "rolled worker 0 " in run.stdout and "rolled worker 1 " in run.stdout, run.stdout[-4000:]


def test_upgrade_changes_every_generation_with_nothing_failed(cluster):
    p, ca = cluster
    diff = TB.m3deploy("plan", tbrun.INVENTORY, *version(NEW), "--diff-deployed", merge=True)
    assert "generation change" in diff.stdout, diff.stdout[-3000:]
    change(p, ca, version(NEW), f"upgrade: Dynamo {OLD} -> {NEW} (every worker and both frontends)")
    hosts = TB.plan(version(NEW))
    w = hosts.group("workers")[0].name
    env = TB.on(w, "cat /etc/m3/m3-worker@0.env")
    assert f"DYN_NAMESPACE_WORKER_SUFFIX={hosts.generation.id}" in env
    assert "dynamo-1.6.0" in TB.on(w, "ls /opt/m3")  # the previous generation's venv kept for the roll back
    # Dynamo's own view: every frontend lists the workers under the new generation's namespace, none under the old
    for url in frontend_urls(hosts, "/health"):
        doc = json.loads(urllib.request.urlopen(url, timeout=10).read())
        spaces = {i.get("namespace") for i in workers(doc)}
        print(f"{url}: generate instances in namespaces {sorted(map(str, spaces))}")
        assert spaces == {f"dynamo-{hosts.generation.id}"}, (url, doc)


def test_rollback_returns_with_nothing_failed(cluster):
    p, ca = cluster
    diff = TB.m3deploy("plan", tbrun.INVENTORY, *version(NEW), "--diff-deployed", merge=True)
    assert f"--data m3_dynamo_version={OLD}" in diff.stdout, diff.stdout[-3000:]
    change(p, ca, version(OLD), f"roll back: Dynamo {NEW} -> {OLD} (every worker and both frontends)")
