"""End-to-end: monitoring on the testbed (`--data m3_monitor=true` on every command; docs/OBSERVE.md). Needs root.

One testbed for this module under its own name and range (m3ob, 10.104.0.0/24: 1 control + 2 mocker workers),
deployed with the user's command line (`pyinfra -y inventories/testbed.py deploy.py`, M3_TESTBED=m3ob). In file
order:

1. every planned scrape target (m3deploy.core.monitor.targets) is up in Prometheus within 60 s of the deploy's end;
2. every generated rule is loaded and healthy;
3. the dashboard-versus-Prometheus contract: after some traffic, every metric name a rule or dashboard panel
   reads is among the live Prometheus's /api/v1/label/__name__/values;
4. `m3deploy verify` passes its metrics/* checks (targets, rules, a pinned request per worker counted);
5. `m3deploy status` while worker 0 is SIGKILLed: the worker shows down (or not routable), the command exits 1
   and names it; once systemd has restarted it, status shows it routable again and exits 0;
6. one panel's query (the frontend's time to first token, p50/p99) rendered to a PNG from the testbed's
   Prometheus: benchmarks/results/observe-testbed-ttft.png;
7. the bench report's server-side view (m3deploy.check.bench.serverview) of a load window: queueing, the request plane's
   queue time, each worker's KV usage and time to first response: benchmarks/results/observe-testbed-server.png;
8. teardown (`m3_state=absent`) leaves no monitoring unit, mask, file, package or listener.

Keep the testbed after the run: M3_E2E_KEEP=1.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import pytest
import tbrun

from tbssh import ssh_to

pytestmark = pytest.mark.e2e

NAME = "m3ob"
SUBNET = "10.104.0.0/24"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "M3_TESTBED": NAME, "M3_TESTBED_CONTROL": "1"}
TB = tbrun.Testbed(NAME, SUBNET, 3, ENV, cli=True)
PNG = os.path.join(REPO, "benchmarks", "results", "observe-testbed-ttft.png")
SERVER_PNG = os.path.join(REPO, "benchmarks", "results", "observe-testbed-server.png")
ssh = ssh_to(NAME)


# monitoring is off by default (group_data/testbed.py too); this module turns it on as a user would, on every command
DATA = ("m3_monitor=true", "m3_monitor_scrape_interval_s=5")
DATA_ARGS = [a for kv in DATA for a in ("--data", kv)]


def m3(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return TB.m3deploy(*args, *DATA_ARGS, timeout=timeout)


def _plan():
    return TB.plan(DATA)


@pytest.fixture(scope="module")
def testbed(testbed_up):
    """A deployed 3-host testbed with monitoring; yields (plan, seconds since the deploy ended)."""
    with testbed_up(TB, deploy=DATA_ARGS, timeout=1500):
        yield _plan(), time.monotonic()


def _load(plan, n: int = 40, threads: int = 4) -> int:
    """n small chat requests through the frontend; the number answered 200."""
    ok = []

    def one(i):
        body = json.dumps({"model": plan.served_model_name, "max_tokens": 16,
                           "messages": [{"role": "user", "content": f"request {i}: tell me about prometheus"}]})
        req = urllib.request.Request(f"{plan.endpoint}/chat/completions", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                ok.append(r.status == 200)
        except OSError:
            ok.append(False)

    for start in range(0, n, threads):
        ts = [threading.Thread(target=one, args=(i,)) for i in range(start, min(n, start + threads))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    return sum(ok)


def test_every_planned_target_is_up_within_60s_of_the_deploy(testbed):
    from m3deploy.core import monitor

    plan, ended = testbed
    want = {(t.job, t.host, t.service) for t in monitor.targets(plan)}
    assert {j for j, _, _ in want} >= {"frontend", "worker", "etcd", "nats", "node", "prometheus"}
    while True:
        active = tbrun.prom(plan, "/api/v1/targets", state="active")["activeTargets"]
        got = {(t["labels"]["job"], t["labels"]["host"], t["labels"]["service"]): t["health"] for t in active}
        up = {k for k, v in got.items() if v == "up"}
        waited = time.monotonic() - ended
        if up >= want or waited > 60:
            break
        time.sleep(1)
    assert set(got) == want, f"scraped {sorted(got)} want {sorted(want)}"
    assert up == want, f"after {waited:.0f} s not up: {sorted(want - up)} ({[got.get(k) for k in want - up]})"
    print(f"all {len(want)} targets up {waited:.1f} s after the deploy ended")


def test_the_generated_rules_load_and_evaluate(testbed):
    from m3deploy.core import monitor

    plan, _ = testbed
    want = {r.get("record") or r.get("alert") for g in monitor.rules(plan)["groups"] for r in g["rules"]}
    deadline = time.monotonic() + 30
    while True:
        loaded = {r["name"]: r for g in tbrun.prom(plan, "/api/v1/rules")["groups"] for r in g["rules"]}
        unevaluated = [n for n in want if n in loaded and not loaded[n].get("lastEvaluation", "").startswith("20")]
        if not unevaluated or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert want <= set(loaded), sorted(want - set(loaded))
    assert not [f"{n}: {loaded[n].get('lastError')}" for n in want if loaded[n]["health"] != "ok"]
    firing = [n for n in want if loaded[n].get("state") == "firing"]
    assert not firing, f"alerts firing on a healthy testbed: {firing}"


def test_every_metric_a_dashboard_or_rule_uses_exists_in_the_live_prometheus(testbed):
    """The real contract: no dashboard of dead panels (names from /api/v1/label/__name__/values)."""
    from m3deploy.core import monitor

    plan, _ = testbed
    assert _load(plan, 24) == 24
    time.sleep(2 * int(monitor.setting(plan, "m3_monitor_scrape_interval_s")) + 1)  # two scrapes after the traffic
    live = set(tbrun.prom(plan, "/api/v1/label/__name__/values"))
    used = monitor.used_metrics(plan)
    dead = {n: sorted(w) for n, w in used.items() if n not in live}
    assert not dead, f"names used by rules or dashboards that the live Prometheus does not have: {dead}"
    print(f"{len(used)} metric names used, all among the {len(live)} live ones")


def test_verify_passes_its_metrics_checks(testbed):
    res = m3("verify", "inventories/testbed.py", "--json", timeout=600)
    doc = json.loads(res.stdout)
    metrics = [r for r in doc["results"] if r["group"] == "metrics"]
    assert {r["id"] for r in metrics} == {"metrics/targets", "metrics/rules", "metrics/counters"}
    assert all(r["ok"] for r in metrics), [r for r in metrics if not r["ok"]]
    assert doc["ok"], [r for r in doc["results"] if not r["ok"]]


def _status(*extra) -> tuple[int, dict]:
    res = m3("status", "inventories/testbed.py", "--json", *extra, timeout=60)
    assert res.returncode in (0, 1), res.stderr
    return res.returncode, json.loads(res.stdout)


def test_status_shows_a_sigkilled_worker_and_its_return(testbed):
    plan, _ = testbed
    rc, snap = _status()
    assert rc == 0, snap
    assert snap["source"].startswith("prometheus")
    assert [(w["host"], w["service"]) for w in snap["workers"]] == \
        [tuple(w.services[0].split("/")) for w in plan.workers]
    assert all(w["up"] and w["routable"] for w in snap["workers"])
    assert {s["kind"] for s in snap["services"]} >= {"etcd", "nats", "frontend", "prometheus"}
    host, unit = plan.workers[0].services[0].split("/")
    ssh(host, f"systemctl kill -s KILL {unit}.service")
    t0 = time.monotonic()
    seen_down = {}
    while time.monotonic() - t0 < 30:
        for source in ("direct", "prometheus"):
            if source in seen_down:
                continue
            rc, snap = _status("--source", source)
            w0 = next(w for w in snap["workers"] if (w["host"], w["service"]) == (host, unit))
            if rc == 1 and (not w0["up"] or w0["routable"] is False):
                seen_down[source] = time.monotonic() - t0
        if len(seen_down) == 2:
            break
        time.sleep(0.2)
    # systemd restarts a SIGKILLed worker within ~1 s (RestartSec=1): the direct read catches it in between
    assert "direct" in seen_down or "prometheus" in seen_down, "status never showed the killed worker"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        rc, snap = _status()
        if rc == 0:
            break
        time.sleep(1)
    assert rc == 0, snap
    w0 = next(w for w in snap["workers"] if (w["host"], w["service"]) == (host, unit))
    assert w0["up"] and w0["routable"]
    back = time.monotonic() - t0
    deadline = time.monotonic() + 30  # Prometheus sees the restart once it scrapes the new process (uptime reset)
    while time.monotonic() < deadline:
        restarts = next(w for w in _status("--source", "prometheus")[1]["workers"] if w["service"] == unit
                        and w["host"] == host)["restarts"]
        if restarts:
            break
        time.sleep(1)
    assert restarts and restarts >= 1, "Prometheus counted no restart of the killed worker"
    print(f"seen down: {seen_down}; back after {back:.1f} s; restarts (1 h) in Prometheus: {restarts}")


def test_status_names_a_host_that_is_down(testbed):
    plan, _ = testbed
    host = plan.workers[-1].hosts[0]
    ssh(host, "systemctl stop m3-node-exporter.service " + " ".join(
        f"{s.name}.service" for s in plan.host(host).services if s.kind in ("worker", "scripted")))
    try:
        rc, snap = _status("--source", "direct")
        assert rc == 1 and host in snap["hosts_down"], snap
        assert not next(w for w in snap["workers"] if w["host"] == host)["up"]
    finally:
        ssh(host, "systemctl start " + " ".join(f"{s.name}.service" for s in plan.host(host).services
                                                 if s.kind in ("worker", "scripted", "node-exporter")))
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and _status()[0] != 0:
        time.sleep(1)
    assert _status()[0] == 0


def test_render_one_panel_to_png(testbed):
    """The overview dashboard's "Time to first token" panel, queried over the run from the live Prometheus."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from m3deploy.core import monitor

    plan, _ = testbed
    assert _load(plan, 40) == 40
    time.sleep(2 * int(monitor.setting(plan, "m3_monitor_scrape_interval_s")) + 1)
    panel = next(p for p in monitor.dashboards(plan)[f"m3-{plan.name}-overview.json"]["panels"]
                 if p["title"] == "Time to first token")
    end = time.time()
    fig, ax = plt.subplots(figsize=(8, 4))
    drawn = 0
    for t in panel["targets"]:
        res = tbrun.prom(plan, "/api/v1/query_range", query=t["expr"], start=end - 600, end=end, step=5)["result"]
        for series in res:
            xs = [float(x) - end for x, _ in series["values"]]
            ys = [float(y) * 1000 for _, y in series["values"]]
            if all(math.isnan(y) for y in ys):
                continue  # a model without traffic (the scripted tool-call engine's)
            label = t["legendFormat"].replace("{{model}}", series["metric"].get("model", ""))
            ax.plot(xs, ys, label=label)
            drawn += sum(1 for y in ys if not math.isnan(y))
    assert drawn, f"no samples for {panel['targets']}"
    ax.set_xlabel("seconds before now")
    ax.set_ylabel("ms")
    ax.set_title(f"{panel['title']} (testbed {NAME}, Prometheus, 5 s scrapes)")
    ax.legend()
    ax.grid(alpha=0.3)
    os.makedirs(os.path.dirname(PNG), exist_ok=True)
    fig.savefig(PNG, dpi=100, bbox_inches="tight")
    with open(PNG, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_the_server_side_view_of_a_load_window(testbed):
    """What `m3deploy bench` adds to its report (no aiperf needed here: the load is this module's own)."""
    from pathlib import Path

    from m3deploy.check.bench import serverview
    from m3deploy.core import monitor

    plan, _ = testbed
    start = time.time()
    assert _load(plan, 60, threads=8) == 60
    time.sleep(2 * int(monitor.setting(plan, "m3_monitor_scrape_interval_s")) + 1)
    view = serverview.collect(plan, start, time.time())
    assert not view.get("errors"), view.get("errors")
    workers = {str(w.index) for w in plan.workers}  # (and the testbed's scripted engine, by its service name)
    assert set(view["summary"]["worker KV cache usage"]) >= workers, view["summary"]
    assert set(view["summary"]["worker time to first response p99"]) >= workers, view["summary"]
    md = "\n".join(serverview.markdown(view))
    assert "worker time to first response p99 (s)" in md
    print(md)
    path = serverview.plot(view, Path(SERVER_PNG), f"testbed {NAME}: 60 requests, 8 at a time")
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_teardown_removes_the_monitoring(testbed):
    """Last: `m3_state=absent` stops the units, removes the masks, files and data, purges the two packages; nothing
    listens on the monitoring ports any more."""
    from m3deploy.core import components, monitor

    plan, _ = testbed
    res = TB.deploy(*DATA_ARGS, "--data", "m3_state=absent", timeout=900)
    assert res.returncode == 0, f"the teardown failed:\n{res.stdout[-6000:]}"
    ports = {str(p.port) for h in plan.hosts for s in h.services if components.get(s.kind).stage == "monitoring"
             for p in s.ports}
    for h in plan.hosts:
        units = ssh(h.name, "systemctl list-units --all --no-legend --plain 'm3-*' 'prometheus*'").stdout
        assert not [ln for ln in units.splitlines() if ln.split()[1:3] != ["not-found", "inactive"]], units
        # (/usr/local/lib/m3 itself stays, empty: teardown removes the files m3 put there, not the directory)
        left = ssh(h.name, "ls -d /etc/systemd/system/prometheus*.service /etc/systemd/system/m3-*.service "
                           f"/var/lib/m3/prometheus {monitor.NATS_EXPORTER_SCRIPT} /etc/m3 2>/dev/null || true").stdout.split()
        assert not left, f"{h.name}: left after teardown: {left}"
        pkgs = ssh(h.name, "dpkg-query -W -f='${Package} ${Status}\\n' prometheus prometheus-node-exporter "
                           "2>/dev/null || true").stdout
        assert "install ok installed" not in pkgs, f"{h.name}: {pkgs}"
        listening = ssh(h.name, "ss -Hltn").stdout
        assert not [ln for ln in listening.splitlines() if ln.split()[3].rsplit(":", 1)[-1] in ports], listening
