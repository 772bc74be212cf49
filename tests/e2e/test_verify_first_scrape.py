"""End-to-end: verify's metrics checks right after Prometheus starts (issue 36) wait, bounded, for its first scrape.

Debian's real Prometheus (/usr/bin/prometheus, `apt-get install prometheus`: scripts/install-deps.sh installs it)
runs on loopback with the plan's own prometheus.yml (m3deploy.core.monitor.prometheus_config; the rules file left
out: metrics/rules is not what this is about) and scrapes one small /metrics server per planned target, each on
that target's planned address and port (127.0.36.x, no testbed). Checked at once after Prometheus says ready,
some targets are still `unknown` (never scraped: the precondition is asserted); `metrics/targets` must pass all
the same, saying how long it waited, within `first_scrape_s`. A target that does not answer still fails, naming it
(its failed first scrape ends the wait).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from m3deploy.check import verify
from m3deploy.check.verify import metrics
from m3deploy.core import build as planmod
from m3deploy.core import inventory, monitor

pytestmark = pytest.mark.e2e

CONTROL, WORKER = "127.0.36.1", "127.0.36.2"
INTERVAL_S = 10
PROMETHEUS = "/usr/bin/prometheus"


class _Metrics(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"# TYPE m3_test_up gauge\nm3_test_up 1\n"
        self.send_response(200)
        self.send_header("content-type", "text/plain; version=0.0.4")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def _plan():
    hosts = inventory.hosts_from_dict(
        {"control": [("c", {"m3_address": CONTROL})], "workers": [("w1", {"m3_address": WORKER})]},
        all_data={"m3_platform": "sim", "m3_engine": "mocker", "m3_serving": "dynamo", "m3_parallel": "tp1",
                  "m3_auth": False, "m3_monitor": True, "m3_monitor_scrape_interval_s": INTERVAL_S})
    return planmod.build(hosts, name="t36scrape")


@pytest.fixture
def prometheus(tmp_path):
    assert shutil.which(PROMETHEUS), f"{PROMETHEUS} missing: apt-get install prometheus (scripts/install-deps.sh)"
    plan = _plan()
    prom = monitor.prometheus_url(plan)
    servers = []

    def serve(skip=()):
        for t in monitor.targets(plan):
            if t.job == "prometheus" or t.service in skip:
                continue
            host, port = t.address.rsplit(":", 1)
            srv = ThreadingHTTPServer((host, int(port)), _Metrics)
            threading.Thread(target=srv.serve_forever, daemon=True).start()
            servers.append(srv)

    cfg = monitor.prometheus_config(plan)
    cfg["rule_files"] = []
    (tmp_path / "prometheus.yml").write_text(json.dumps(cfg))  # YAML is a superset of JSON
    listen = prom.split("//", 1)[1]
    procs = []

    def start():
        p = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                              f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address={listen}"],
                             stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "w"))
        procs.append(p)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{prom}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return plan
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"Prometheus not ready in 30 s: {(tmp_path / 'prometheus.log').read_text()[-2000:]}")

    yield serve, start
    for p in procs:
        p.terminate()
        p.wait(10)
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def _targets_check(plan):
    return [c for c in metrics.metrics_checks(plan) if c.id == "metrics/targets"]


def test_metrics_targets_right_after_prometheus_starts_waits_for_the_first_scrape(prometheus):
    serve, start = prometheus
    serve()
    plan = start()
    ctx = verify.Context(plan)
    unscraped = metrics._unscraped(ctx)  # the situation right after a deploy: not everything scraped yet
    assert unscraped, "Prometheus had scraped every target before the check ran: this test shows nothing"
    t0 = time.monotonic()
    (r,) = verify.run_checks(_targets_check(plan), ctx)
    took = time.monotonic() - t0
    assert r.ok, r.evidence
    assert "waited" in r.evidence and "for the first scrape" in r.evidence, r.evidence
    assert took <= metrics.first_scrape_s(plan) + 5, took


def test_a_target_that_does_not_answer_fails_naming_it_once_scraped(prometheus):
    serve, start = prometheus
    serve(skip=("m3-scripted",))
    plan = start()
    t0 = time.monotonic()
    (r,) = verify.run_checks(_targets_check(plan), verify.Context(plan))
    took = time.monotonic() - t0
    # its first scrape failed: that is a scrape (health "down"), so the wait ends there, not at the bound
    assert not r.ok and "down: ['w1/m3-scripted (worker)" in r.evidence and "connection refused" in r.evidence, \
        r.evidence
    assert took <= metrics.first_scrape_s(plan) + 5, took
