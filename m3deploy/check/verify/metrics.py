"""verify's `metrics/*` checks (m3_monitor; docs/OBSERVE.md), against the plan's Prometheus:

- `metrics/targets`: Prometheus scrapes exactly the plan's targets (m3deploy.core.monitor.targets) and every one
  is up;
- `metrics/rules`: every generated recording and alert rule is loaded and evaluates without error;
- `metrics/counters`: a request pinned to each planned worker (nvext.backend_instance_id, as smoke/routable) shows
  up in Prometheus: that worker's `dynamo_component_requests_total` (generate) rises within 3 scrape intervals.

Right after a deploy Prometheus may not have scraped every target yet (a target is `unknown` until its first
scrape, at an offset within the scrape interval): `metrics/targets` and `metrics/counters` first wait, at most
`first_scrape_s` (2 scrape intervals + 5 s: 35 s at the default 15 s), until Prometheus answers and has scraped every
planned target once; then they judge what they see (a target still unscraped then fails, naming it).
"""
from __future__ import annotations

import time

from m3deploy.check import readiness
from m3deploy.check.checks import Check, CheckFailed, Context, instance_services, worker_pools
from m3deploy.check.status import Prometheus
from m3deploy.core import monitor
from m3deploy.core.model import ClusterPlan


def _prom(ctx: Context) -> Prometheus:
    return Prometheus(monitor.prometheus_url(ctx.plan))


NEVER_SCRAPED = "0001-01-01T00:00:00Z"  # Prometheus's lastScrape of a target it has not scraped yet


def first_scrape_s(plan: ClusterPlan) -> float:
    """The bound of the wait for Prometheus's first scrape of every target: 2 scrape intervals + 5 s."""
    return 2 * int(monitor.setting(plan, "m3_monitor_scrape_interval_s")) + 5


def _unscraped(ctx: Context) -> list[str]:
    want = {(t.job, t.host, t.service) for t in monitor.targets(ctx.plan)}
    try:
        active = _prom(ctx).api("/api/v1/targets?state=active")["activeTargets"]
    except (OSError, ValueError, KeyError) as e:  # not answering yet (just restarted)
        return [f"Prometheus ({type(e).__name__}: {str(e)[:80]})"]
    seen = {(t["labels"].get("job"), t["labels"].get("host"), t["labels"].get("service")) for t in active
            if t.get("lastScrape", NEVER_SCRAPED) != NEVER_SCRAPED and t.get("health") != "unknown"}
    return sorted(f"{h}/{s} ({j})" for j, h, s in want - seen)


def first_scrape(ctx: Context) -> str:
    """Wait (at most first_scrape_s) until Prometheus has scraped every planned target once; asked once per
    verify. Returns a note for the evidence ("" when nothing had to wait)."""
    if "first_scrape" not in ctx.cache:
        t0 = time.monotonic()
        bound = first_scrape_s(ctx.plan)
        pending = _unscraped(ctx)
        while pending and time.monotonic() - t0 < bound:
            time.sleep(0.5)
            pending = _unscraped(ctx)
        took = time.monotonic() - t0
        ctx.cache["first_scrape"] = "" if took < 0.5 else (
            f" (waited {took:.1f} s for the first scrape" + (f", bound {bound:g} s: still {pending[:4]})" if pending
                                                              else ")"))
    return ctx.cache["first_scrape"]


def _targets(ctx: Context) -> str:
    waited = first_scrape(ctx)
    want = {(t.job, t.host, t.service) for t in monitor.targets(ctx.plan)}
    active = _prom(ctx).api("/api/v1/targets?state=active")["activeTargets"]
    got = {(t["labels"].get("job"), t["labels"].get("host"), t["labels"].get("service")): t for t in active}
    missing = sorted(want - set(got))
    extra = sorted(set(got) - want)
    down = sorted(f"{k[1]}/{k[2]} ({k[0]}): {got[k].get('lastError') or got[k].get('health')}"
                  for k in want & set(got) if got[k].get("health") != "up")
    ev = f"{len(want & set(got)) - len(down)} of {len(want)} planned targets up{waited}"
    if missing or extra or down:
        raise CheckFailed(ev + "".join([f"; not scraped: {missing}" if missing else "",
                                        f"; unplanned: {extra}" if extra else "", f"; down: {down}" if down else ""]))
    return ev


def _rules(ctx: Context) -> str:
    doc = monitor.rules(ctx.plan)
    want = {r.get("record") or r.get("alert") for g in doc["groups"] for r in g["rules"]}
    loaded = {}
    for g in _prom(ctx).api("/api/v1/rules")["groups"]:
        for r in g["rules"]:
            loaded[r["name"]] = r
    missing = sorted(want - set(loaded))
    bad = sorted(f"{n}: {loaded[n].get('lastError')}" for n in want & set(loaded) if loaded[n].get("health") == "err")
    firing = sorted(n for n in want & set(loaded) if loaded[n].get("state") == "firing")
    ev = f"{len(want) - len(missing)} of {len(want)} rules loaded" + (f"; firing: {firing}" if firing else "")
    if missing or bad:
        raise CheckFailed(ev + (f"; missing {missing}" if missing else "") + (f"; failing {bad}" if bad else ""))
    return ev


def _counters(ctx: Context) -> str:
    waited = first_scrape(ctx)
    prom, plan = _prom(ctx), ctx.plan
    expr = f'sum by (host, service, worker_id) ({monitor.WK_REQUESTS}{{job="worker",dynamo_endpoint="generate"}})'
    before = prom.by(expr, "host", "service", "worker_id")
    ids = {(h, s): wid for (h, s, wid) in before if wid}
    planned = [(h.name, s.name) for h, s in instance_services(plan)]
    missing = [f"{h}/{s}" for h, s in planned if (h, s) not in ids]
    if missing:
        raise CheckFailed(f"Prometheus has no generate counter of {missing} yet{waited}")
    readiness.answered_by_each(plan.endpoint, plan.served_model_name,
                               {f"{h}/{s}": int(ids[(h, s)], 16) for h, s in planned}, api_key=ctx.api_key,
                               pools=worker_pools(plan))  # one request pinned to each (m3_disagg: both pools)
    wait = 3 * int(monitor.setting(plan, "m3_monitor_scrape_interval_s")) + 2
    deadline, short = time.monotonic() + wait, planned
    while True:
        after = prom.by(expr, "host", "service", "worker_id")
        short = [k for k in planned if after.get((*k, ids[k]), 0) <= before.get((*k, ids[k]), 0)]
        if not short or time.monotonic() > deadline:
            break
        time.sleep(1)
    if short:
        raise CheckFailed(f"after a pinned request each, the counters of {[f'{h}/{s}' for h, s in short]} did not "
                          f"rise in Prometheus within {wait} s")
    return f"{len(planned)} worker(s): each pinned request counted in Prometheus{waited}"


def metrics_checks(plan: ClusterPlan) -> list[Check]:
    url = monitor.prometheus_url(plan)
    if not url:
        return []
    out = [Check("metrics/targets", "metrics", "controller", "Prometheus scrapes every planned target, all up",
                 _targets, f"curl -sS '{url}/api/v1/targets?state=active' | python3 -m json.tool"),
           Check("metrics/rules", "metrics", "controller", "every generated rule is loaded and healthy", _rules,
                 f"curl -sS {url}/api/v1/rules | python3 -m json.tool")]
    if plan.serving == "dynamo" and plan.workers and plan.endpoint:
        out.append(Check("metrics/counters", "metrics", "controller",
                         "a request pinned to each worker raises its counter in Prometheus", _counters,
                         f"curl -sS '{url}/api/v1/query?query={monitor.WK_REQUESTS}'"))
    return out
