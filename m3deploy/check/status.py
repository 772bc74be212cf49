"""`m3deploy status INVENTORY [--watch]`: the cluster now, per worker and per control service (docs/OBSERVE.md).

With Prometheus in the plan (m3_monitor) the numbers come from it (rates over 1 min, quantiles over 5 min, restarts
over 1 h); when it does not answer, or the plan has none, from the services' own /metrics (quantiles since each
process started, rates between two --watch refreshes). Routable is always the frontend's own word: the worker's
instance id (label worker_id of its /metrics, in hex) among the frontend's /health `generate` instances.
A host none of whose endpoints answers is reported down, by name; its rows say "down" instead of numbers.
Pure HTTP from the controller: no SSH, no pyinfra.
"""
from __future__ import annotations

import json
import math
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from m3deploy.check.checks import (
    frontend,
    frontend_url,
    instance_services,
    metrics_url,
    parse_prometheus,
)
from m3deploy.core import monitor
from m3deploy.core.errors import plural
from m3deploy.core.inputs import url_host
from m3deploy.core.model import ClusterPlan

TIMEOUT_S = 3.0


def _get(url: str, timeout: float = TIMEOUT_S) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode("utf-8", "replace")


def _try(url: str) -> str | None:
    try:
        return _get(url)
    except (OSError, ValueError):
        return None


class Prometheus:
    """Instant queries against the plan's Prometheus (HTTP API v1)."""

    def __init__(self, base: str):
        self.base = base.rstrip("/")

    def query(self, promql: str) -> list[tuple[dict[str, str], float]]:
        doc = json.loads(_get(f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": promql}), 10))
        if doc.get("status") != "success":
            raise ValueError(f"Prometheus: {doc.get('error') or doc}")
        return [(r["metric"], float(r["value"][1])) for r in doc["data"]["result"]]

    def by(self, promql: str, *keys: str) -> dict[tuple, float]:
        return {tuple(m.get(k, "") for k in keys): v for m, v in self.query(promql)}

    def api(self, path: str) -> Any:
        return json.loads(_get(f"{self.base}{path}", 10))["data"]


@dataclass
class WorkerRow:
    worker: int
    host: str
    service: str
    pool: str
    up: bool
    routable: bool | None = None  # None: no frontend to ask
    inflight: float | None = None
    rps: float | None = None
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    kv_usage: float | None = None
    restarts: float | None = None  # over the last hour (Prometheus only)
    uptime_s: float | None = None


@dataclass
class ServiceRow:
    host: str
    service: str
    kind: str
    up: bool
    detail: str = ""


@dataclass
class Snapshot:
    cluster: str
    source: str  # "prometheus <url>" | "direct /metrics"
    at: float
    workers: list[WorkerRow] = field(default_factory=list)
    services: list[ServiceRow] = field(default_factory=list)
    hosts_down: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def ok(self) -> bool:
        return not self.hosts_down and all(w.up and w.routable is not False for w in self.workers) and \
            all(s.up for s in self.services)


def quantile_from_buckets(buckets: dict[float, float], q: float) -> float | None:
    """histogram_quantile over cumulative buckets {le: count} (Prometheus's linear interpolation)."""
    if not buckets:
        return None
    les = sorted(buckets)
    total = buckets[les[-1]]
    if total <= 0:
        return None
    rank, prev_le, prev_c = q * total, 0.0, 0.0
    for le in les:
        c = buckets[le]
        if c >= rank:
            if math.isinf(le):
                return prev_le
            return prev_le + (le - prev_le) * ((rank - prev_c) / (c - prev_c) if c > prev_c else 0)
        prev_le, prev_c = le, c
    return None


def _ids_registered(plan: ClusterPlan) -> set[int] | None:
    """The frontend's `generate` instance ids (None: no frontend, or it does not answer)."""
    if frontend(plan) is None:
        return None
    body = _try(frontend_url(plan, "/health"))
    if body is None:
        return None
    from m3deploy.check.checks import generate_instances

    try:
        return {int(i.get("instance_id")) for i in generate_instances(json.loads(body))
                if i.get("instance_id") is not None}
    except (ValueError, TypeError, AttributeError):
        return None


def _direct_worker(plan: ClusterPlan, h, s, text: str | None) -> WorkerRow:
    row = WorkerRow(worker=s.worker, host=h.name, service=s.name, pool=monitor.pool_of(s), up=text is not None)
    if text is None:
        return row
    kv, buckets, ids = monitor.kv_usage_metric(plan), {}, set()
    for name, labels, value in parse_prometheus(text):
        if labels.get("worker_id"):
            ids.add(labels["worker_id"])
        gen = labels.get("dynamo_endpoint") == "generate"
        if name == monitor.WK_INFLIGHT and gen:
            row.inflight = (row.inflight or 0) + value
        elif name == monitor.WK_REQUESTS and gen:
            row.rps = (row.rps or 0) + value  # a counter here: _direct turns two of them into a rate
        elif name == f"{monitor.WK_TTFT}_bucket":
            le = float(labels.get("le", "inf").replace("+Inf", "inf"))
            buckets[le] = buckets.get(le, 0) + value
        elif kv and name == kv:
            row.kv_usage = max(row.kv_usage or 0, value)
        elif name == monitor.WK_UPTIME:
            row.uptime_s = value
    row.ttft_p50_s, row.ttft_p99_s = quantile_from_buckets(buckets, 0.5), quantile_from_buckets(buckets, 0.99)
    row._ids = ids  # type: ignore[attr-defined]
    return row


def _control_direct(plan: ClusterPlan) -> list[ServiceRow]:
    rows = []
    for h in plan.hosts:
        for s in h.services:
            if s.kind not in ("etcd", "nats", "frontend", "prometheus"):
                continue
            r = s.readiness
            body = _try(r.url) if r and r.url else None
            up, detail = body is not None, ""
            if s.kind == "etcd" and up:
                m = {n: v for n, _, v in parse_prometheus(_try(f"{r.url.rsplit('/', 1)[0]}/metrics") or "")}
                detail = ("leader" if m.get("etcd_server_is_leader") == 1 else "follower") + \
                    ("" if m.get(monitor.ETCD_HAS_LEADER, 1) == 1 else ", NO LEADER")
                members = sum(1 for x in plan.hosts for y in x.services if y.kind == "etcd")
                detail += f", {members} planned member(s)"
            elif s.kind == "nats" and up:
                mon = next(p for p in s.ports if p.name == "monitor")
                try:
                    v = json.loads(_try(f"http://{url_host(mon.address)}:{mon.port}/varz") or "{}")
                    routes = len(v.get("cluster", {}).get("urls") or [])
                    detail = (f"{v.get('connections', '?')} connection(s), {plural(routes, 'route')}, slow consumers "
                              f"{v.get('slow_consumers', '?')}")
                except ValueError:
                    pass
            elif s.kind == "frontend" and up:
                ids = _ids_registered(plan)
                detail = f"{len(ids)} generate instance(s) listed" if ids is not None else "/health does not answer"
            rows.append(ServiceRow(h.name, s.name, s.kind, up, detail))
    return rows


_PREV: dict[tuple[str, str], tuple[float, float]] = {}  # direct mode: (host, service) -> (time, request counter)


def _direct(plan: ClusterPlan, notes: list[str]) -> Snapshot:
    snap = Snapshot(plan.name, "direct /metrics", time.time(), notes=notes)
    pairs = instance_services(plan)
    urls = {(t.host, t.service): f"http://{t.address}{t.path}" for t in monitor.targets(plan)
            if t.job in ("worker", "engine")}
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(pairs)))) as ex:  # a standalone engine: its HTTP /metrics
        texts = list(ex.map(lambda hs: _try(metrics_url(*hs) or urls.get((hs[0].name, hs[1].name), "")), pairs))
    registered = _ids_registered(plan)
    now = time.monotonic()
    for (h, s), text in zip(pairs, texts):
        row = _direct_worker(plan, h, s, text)
        if row.up and registered is not None:
            row.routable = any(int(i, 16) in registered for i in getattr(row, "_ids", ()))
        if row.rps is not None:
            count, key = row.rps, (h.name, s.name)
            prev = _PREV.get(key)
            row.rps = (count - prev[1]) / (now - prev[0]) if prev and count >= prev[1] and now > prev[0] else None
            _PREV[key] = (now, count)
        if hasattr(row, "_ids"):
            del row._ids
        snap.workers.append(row)
    snap.services = _control_direct(plan)
    snap.hosts_down = _down_hosts(plan, {(w.host, w.service): w.up for w in snap.workers}
                                  | {(x.host, x.service): x.up for x in snap.services})
    snap.notes.append("direct: TTFT quantiles since each worker started; req/s between two --watch refreshes")
    return snap


def _down_hosts(plan: ClusterPlan, up: dict[tuple[str, str], bool]) -> list[str]:
    """Hosts where no endpoint answers: none of the probed ones (`up`: (host, service) -> answered) and none of
    the host's other services' readiness URLs (its node exporter, ...), probed now."""
    down = []
    for h in plan.hosts:
        seen = {svc: v for (host, svc), v in up.items() if host == h.name}
        if any(seen.values()):
            continue
        others = [s.readiness.url for s in h.services
                  if s.name not in seen and s.readiness and s.readiness.kind == "http" and s.readiness.url]
        if (seen or others) and not any(_try(url) is not None for url in others):
            down.append(h.name)
    return down


def _from_prometheus(plan: ClusterPlan, prom: Prometheus, notes: list[str]) -> Snapshot:
    snap = Snapshot(plan.name, f"prometheus {prom.base}", time.time(), notes=notes)
    keys = ("host", "service")
    up = prom.by("up", *keys)
    wk = "worker" if plan.serving == "dynamo" else "engine"

    def q(expr):
        return prom.by(expr, *keys)

    inflight = q("m3:worker_inflight")
    rps = q("m3:worker_requests:rate1m")
    p50, p99 = q("m3:worker_ttft_seconds:p50"), q("m3:worker_ttft_seconds:p99")
    kv = q("m3:worker_kv_usage:ratio") if monitor.kv_usage_metric(plan) else {}
    restarts = q(monitor.restarts_expr(wk, monitor.window(plan, "1h")))
    uptime = q(f'max by (host, service) ({monitor.WK_UPTIME}{{job="{wk}"}})')
    registered = _ids_registered(plan)
    ids: dict[tuple, set[str]] = {}
    for m, _ in prom.query(f'{monitor.WK_REQUESTS}{{job="{wk}",dynamo_endpoint="generate"}}'):
        ids.setdefault((m.get("host", ""), m.get("service", "")), set()).add(m.get("worker_id", ""))

    def num(d, k):
        v = d.get(k)
        return None if v is None or math.isnan(v) else v

    for h, s in instance_services(plan):
        k = (h.name, s.name)
        is_up = up.get(k) == 1
        row = WorkerRow(worker=s.worker, host=h.name, service=s.name, pool=monitor.pool_of(s), up=is_up)
        if is_up:
            row.inflight, row.rps, row.ttft_p50_s, row.ttft_p99_s = (num(inflight, k), num(rps, k), num(p50, k),
                                                                     num(p99, k))
            row.kv_usage, row.uptime_s = num(kv, k), num(uptime, k)
            if registered is not None:
                row.routable = any(i and int(i, 16) in registered for i in ids.get(k, ()))
        row.restarts = num(restarts, k)
        snap.workers.append(row)
    snap.services = _control_direct(plan)  # leader and members are the services' own word
    snap.hosts_down = _down_hosts(plan, {k: v == 1 for k, v in up.items()})
    snap.notes.append("prometheus: req/s over 1 min, TTFT (worker's time to first response) over 5 min, restarts 1 h")
    return snap


def snapshot(plan: ClusterPlan, source: str = "auto") -> Snapshot:
    """The cluster now. source: auto (Prometheus when the plan has it and it answers), prometheus, direct."""
    base = monitor.prometheus_url(plan)
    notes: list[str] = []
    if source in ("auto", "prometheus") and base:
        try:
            return _from_prometheus(plan, Prometheus(base), notes)
        except (OSError, ValueError) as e:
            if source == "prometheus":
                raise
            notes.append(f"Prometheus at {base} did not answer ({e}): read each /metrics directly")
    elif source == "prometheus":
        raise ValueError(f"cluster {plan.name} has no Prometheus (m3_monitor is off)")
    return _direct(plan, notes)


# ------------------------------------------------------------------------------------------- rendering
def _f(v, fmt: str, scale: float = 1.0) -> str:
    return "-" if v is None else format(v * scale, fmt)


def render(snap: Snapshot):
    """The snapshot as rich renderables (a table per section)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    t = Table(title=f"m3deploy status {snap.cluster} ({snap.source})", expand=False)
    for col in ("worker", "host/service", "pool", "up", "routable", "in flight", "req/s", "TTFT p50", "TTFT p99",
                "KV", "restarts", "uptime"):
        t.add_column(col, justify="right" if col not in ("host/service", "pool", "up", "routable") else "left")
    for w in snap.workers:
        down = "[bold red]HOST DOWN[/]" if w.host in snap.hosts_down else "[bold red]down[/]"
        up = "[green]up[/]" if w.up else down
        rt = "-" if w.routable is None else ("[green]yes[/]" if w.routable else "[bold red]no[/]")
        t.add_row(str(w.worker), f"{w.host}/{w.service}", w.pool, up, rt, _f(w.inflight, ".0f"), _f(w.rps, ".2f"),
                  _f(w.ttft_p50_s, ".0f", 1000) + (" ms" if w.ttft_p50_s is not None else ""),
                  _f(w.ttft_p99_s, ".0f", 1000) + (" ms" if w.ttft_p99_s is not None else ""),
                  _f(w.kv_usage, ".0%"), _f(w.restarts, ".0f"), _f(w.uptime_s, ".0f") + ("s" if w.uptime_s else ""))
    c = Table(title="control services", expand=False)
    for col in ("host/service", "kind", "up", "detail"):
        c.add_column(col)
    for s in snap.services:
        c.add_row(f"{s.host}/{s.service}", s.kind, "[green]up[/]" if s.up else "[bold red]down[/]", s.detail)
    parts = [t, c]
    if snap.hosts_down:
        parts.append(Text(f"hosts down (no endpoint answers): {', '.join(snap.hosts_down)}", style="bold red"))
    parts += [Text(f"note: {n}") for n in snap.notes]
    return Group(*parts)
