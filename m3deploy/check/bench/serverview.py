"""The server-side view of a time window from the plan's Prometheus (m3_monitor; docs/OBSERVE.md, docs/BENCH.md):
what `m3deploy bench` adds to its report, beside the client's numbers: queueing at the frontend, the request
plane's queue time, each worker's KV cache usage and time to first response, over the run.

`collect(plan, start, end)` -> {"window": ..., "series": {name: {label: [[t, v], ...]}}, "summary": {name: {label:
{"max", "mean"}}}}; {} when the plan has no Prometheus. `plot(view, path)` draws it.
"""
from __future__ import annotations

import json
import math
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from m3deploy.core import monitor
from m3deploy.core.model import ClusterPlan

# name -> (PromQL, the label that names a series, unit)
QUERIES = {
    "frontend queued requests": (f"sum({monitor.FE_QUEUED})", "", "requests"),
    "frontend in flight": (f"sum({monitor.FE_INFLIGHT})", "", "requests"),
    "request plane queue p99": (("histogram_quantile(0.99, sum by (le) (rate(dynamo_request_plane_queue_seconds_bucket"
                                 "[{w1}])))"), "", "s"),
    "worker time to first response p99": ("m3:worker_ttft_seconds:p99", "worker", "s"),
    "worker KV cache usage": ("m3:worker_kv_usage:ratio", "worker", "ratio"),
}


def _range(base: str, query: str, start: float, end: float, step: float) -> list[dict]:
    q = urllib.parse.urlencode({"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"})
    with urllib.request.urlopen(f"{base}/api/v1/query_range?{q}", timeout=20) as r:
        doc = json.loads(r.read())
    if doc.get("status") != "success":
        raise ValueError(doc.get("error") or doc)
    return doc["data"]["result"]


def summarize(result: list[dict], label: str) -> tuple[dict[str, list], dict[str, dict[str, float]]]:
    """Prometheus range results -> ({series label: [[t, v]...]}, {series label: {max, mean}}), NaN dropped."""
    series, summary = {}, {}
    for r in result:
        key = (r["metric"].get(label) or r["metric"].get("service") or "all") if label else "all"
        pts = [[float(t), float(v)] for t, v in r["values"] if not math.isnan(float(v))]
        if not pts:
            continue
        series[key] = pts
        vals = [v for _, v in pts]
        summary[key] = {"max": round(max(vals), 6), "mean": round(sum(vals) / len(vals), 6)}
    return series, summary


def collect(plan: ClusterPlan, start: float, end: float) -> dict[str, Any]:
    base = monitor.prometheus_url(plan)
    if not base or end <= start:
        return {}
    step = max(1.0, float(monitor.setting(plan, "m3_monitor_scrape_interval_s")))
    out: dict[str, Any] = {"window": {"start": start, "end": end, "step_s": step, "prometheus": base},
                           "series": {}, "summary": {}, "units": {}}
    for name, (query, label, unit) in QUERIES.items():
        query = query.replace("{w1}", monitor.window(plan, "1m"))
        if "kv_usage" in query and not monitor.kv_usage_metric(plan):
            continue
        try:
            series, summary = summarize(_range(base, query, start, end + step, step), label)
        except (OSError, ValueError) as e:
            out.setdefault("errors", {})[name] = str(e)[:200]
            continue
        out["series"][name], out["summary"][name], out["units"][name] = series, summary, unit
    return out


def markdown(view: dict[str, Any]) -> list[str]:
    if not view.get("summary"):
        return []
    win = view["window"]
    lines = ["", f"Server side, from Prometheus ({win['prometheus']}, {win['step_s']:g} s steps):",
             "", "| metric | series | max | mean |", "|---|---|---|---|"]
    for name, per in view["summary"].items():
        for key, s in sorted(per.items()):
            lines.append(f"| {name} ({view['units'][name]}) | {key} | {s['max']:g} | {s['mean']:g} |")
    return lines


def plot(view: dict[str, Any], path: Path, title: str) -> Path | None:
    names = [n for n in view.get("series", {}) if view["series"][n]]
    if not names:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = view["window"]["start"]
    fig, axes = plt.subplots(len(names), 1, figsize=(8, 2.2 * len(names)), sharex=True, squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        for key, pts in sorted(view["series"][name].items()):
            ax.plot([t - t0 for t, _ in pts], [v for _, v in pts], label=key)
        ax.set_ylabel(view["units"][name])
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
        if len(view["series"][name]) > 1:
            ax.legend(fontsize=7)
    axes[-1, 0].set_xlabel("seconds since the run started")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
