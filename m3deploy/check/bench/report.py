"""Benchmark reports (pure, no network): metrics with `vllm bench serve`'s meanings, report.json/report.md,
`--compare`, and the PNG plots. `m3deploy.bench` runs the clients and calls these.

Metrics are computed the way vLLM's `benchmarks/serve.py` (`calculate_metrics`) computes them, from one
record per request, whichever client sent the requests:

- completed / failed: requests that returned a full response / that errored;
- TTFT: time from sending a request to its first token; percentiles over completed requests;
- TPOT: per request, (latency - TTFT) / (output tokens - 1), requests with > 1 output token;
- ITL: every gap between two consecutive streamed chunks, pooled over all requests;
- request_throughput = completed / duration; output_throughput_tok_s = output tokens / duration;
  total_token_throughput_tok_s = (input + output tokens) / duration.

Percentiles are numpy's (linear interpolation), as vLLM's. A run of `vllm bench serve --save-result
--save-detailed` (the GPU-cluster path) already carries these numbers: `from_vllm_result` reads them as they are.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from m3deploy.check.bench import serverview
from m3deploy.core.errors import plural

PCTS = (50, 90, 99)
LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms")
# the numbers `--compare` and report.md show: (key in a run, label, better when higher)
HEADLINE = (("request_throughput", "request throughput (req/s)", True),
            ("output_throughput_tok_s", "output throughput (tok/s)", True),
            ("total_token_throughput_tok_s", "total token throughput (tok/s)", True),
            ("ttft_ms.p50", "TTFT p50 (ms)", False), ("ttft_ms.p99", "TTFT p99 (ms)", False),
            ("tpot_ms.p50", "TPOT p50 (ms)", False), ("tpot_ms.p99", "TPOT p99 (ms)", False),
            ("itl_ms.p50", "ITL p50 (ms)", False), ("itl_ms.p99", "ITL p99 (ms)", False),
            ("completed", "completed", True), ("failed", "failed", False))


@dataclass
class Record:
    """One request as a client saw it (seconds)."""

    ok: bool
    ttft_s: float = 0.0
    latency_s: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    itls_s: list[float] = field(default_factory=list)
    error: str = ""


def summary(values_s: list[float]) -> dict[str, float]:
    """{p50, p90, p99, mean} in ms of values in seconds (0 for no values, as vLLM)."""
    import numpy as np

    v = np.asarray(values_s or [0.0], dtype=float) * 1000.0
    out = {f"p{p}": round(float(np.percentile(v, p)), 3) for p in PCTS}
    out["mean"] = round(float(np.mean(v)), 3)
    return out


def metrics(records: Iterable[Record], duration_s: float) -> dict[str, Any]:
    """One run's metrics (vLLM's calculate_metrics) plus the raw distributions for the plots."""
    recs = list(records)
    done = [r for r in recs if r.ok]
    ttfts = [r.ttft_s for r in done]
    tpots = [(r.latency_s - r.ttft_s) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    itls = [x for r in done for x in r.itls_s]
    out_tok = sum(r.output_tokens for r in done)
    in_tok = sum(r.input_tokens for r in done)
    dur = duration_s if duration_s > 0 else float("nan")
    errors = Counter(r.error[:160] or "unknown error" for r in recs if not r.ok)
    return {
        "completed": len(done), "failed": len(recs) - len(done), "duration_s": round(duration_s, 3),
        "total_input_tokens": in_tok, "total_output_tokens": out_tok,
        "ttft_ms": summary(ttfts), "tpot_ms": summary(tpots), "itl_ms": summary(itls),
        "e2el_ms": summary([r.latency_s for r in done]),
        "request_throughput": _round(len(done) / dur), "output_throughput_tok_s": _round(out_tok / dur),
        "total_token_throughput_tok_s": _round((in_tok + out_tok) / dur),
        "errors": dict(errors),
        "distributions": {"ttft_ms": _ms(ttfts), "tpot_ms": _ms(tpots), "itl_ms": _ms(itls)},
    }


def _round(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 3)


def _ms(values_s: list[float]) -> list[float]:
    return [round(v * 1000.0, 3) for v in values_s]


# ------------------------------------------------------------------------------------------------ clients
def from_aiperf(artifact_dir: str | Path) -> dict[str, Any]:
    """Metrics of one `aiperf profile` run from its per-request export (profile_export.jsonl) and its
    phase's start and end (profile_export_aiperf.json). aiperf's names: `time_to_first_token` = TTFT,
    `request_latency` = latency, `inter_chunk_latency` = vLLM's ITL list (aiperf's own `inter_token_latency`
    is vLLM's TPOT, recomputed here from the same fields)."""
    d = Path(artifact_dir)
    records_file, summary_file = d / "profile_export.jsonl", d / "profile_export_aiperf.json"
    for f in (records_file, summary_file):
        if not f.is_file():
            raise FileNotFoundError(f"aiperf wrote no {f} (see aiperf's log in {d / 'logs'})")
    recs = []
    for line in records_file.read_text().splitlines():
        if line.strip():
            recs.append(_aiperf_record(json.loads(line)))
    agg = json.loads(summary_file.read_text())
    return metrics(recs, _aiperf_duration_s(agg))


def _aiperf_duration_s(agg: dict) -> float:
    """The profiling phase's wall clock (start_time -> end_time), as vLLM's `duration` (perf_counter around the
    whole run) and as aiperf's own request_throughput uses it; else first request -> last response."""
    from datetime import datetime

    try:
        return (datetime.fromisoformat(agg["end_time"]) - datetime.fromisoformat(agg["start_time"])).total_seconds()
    except (KeyError, TypeError, ValueError):
        dur = agg.get("benchmark_duration") or {}
        return _to_seconds(_aiperf_value(dur), dur.get("unit", "sec"))


_UNIT_S = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0}


def _to_seconds(value, unit: str) -> float:
    if value is None:
        return 0.0
    return float(value) * _UNIT_S.get(str(unit).lower(), 1.0)


def _aiperf_value(m):
    if isinstance(m, dict):
        return m.get("value", m.get("avg"))
    return m


def _aiperf_record(doc: dict) -> Record:
    m = doc.get("metrics") or {}
    err = doc.get("error")

    def sec(name: str):
        v = m.get(name)
        if not isinstance(v, dict):
            return None
        val = v.get("value")
        unit = v.get("unit", "ms")
        if isinstance(val, list):
            return [_to_seconds(x, unit) for x in val]
        return _to_seconds(val, unit)

    ttft, lat = sec("time_to_first_token"), sec("request_latency")
    ok = not err and ttft is not None and lat is not None
    osl = _aiperf_value(m.get("output_sequence_length")) or 0
    isl = _aiperf_value(m.get("input_sequence_length")) or 0
    return Record(ok=ok, ttft_s=ttft or 0.0, latency_s=lat or 0.0, input_tokens=int(isl), output_tokens=int(osl),
                  itls_s=sec("inter_chunk_latency") or [],
                  error="" if ok else (json.dumps(err)[:300] if err else "no first token or latency recorded"))


def from_vllm_result(doc: dict) -> dict[str, Any]:
    """Metrics of a `vllm bench serve --save-result --save-detailed --percentile-metrics ttft,tpot,itl
    --metric-percentiles 50,90,99` result file, as vLLM computed them."""
    def lat(name: str) -> dict[str, float]:
        out = {f"p{p}": doc.get(f"p{p}_{name}_ms") for p in PCTS}
        out["mean"] = doc.get(f"mean_{name}_ms")
        missing = [k for k, v in out.items() if v is None]
        if missing:
            raise ValueError(f"the vllm bench result has no {', '.join(f'{k}_{name}_ms' for k in missing)} "
                             f"(run it with --percentile-metrics ttft,tpot,itl --metric-percentiles 50,90,99)")
        return {k: round(float(v), 3) for k, v in out.items()}

    completed = int(doc["completed"])
    errors = [e for e in doc.get("errors") or [] if e]
    failed = int(doc.get("failed", len(errors)))
    itls = [x for per in doc.get("itls") or [] for x in per]
    ttfts = [t for t in doc.get("ttfts") or [] if t]
    out_lens = doc.get("output_lens") or []
    tpots = []
    for per, n in zip(doc.get("itls") or [], out_lens):
        if n and n > 1 and per:
            tpots.append(sum(per) / (n - 1))
    agg = Counter(str(e)[:160] for e in errors)
    return {
        "completed": completed, "failed": failed, "duration_s": round(float(doc.get("duration", 0.0)), 3),
        "total_input_tokens": int(doc.get("total_input_tokens", 0)),
        "total_output_tokens": int(doc.get("total_output_tokens", 0)),
        "ttft_ms": lat("ttft"), "tpot_ms": lat("tpot"), "itl_ms": lat("itl"),
        "request_throughput": round(float(doc["request_throughput"]), 3),
        "output_throughput_tok_s": round(float(doc["output_throughput"]), 3),
        "total_token_throughput_tok_s": round(float(doc["total_token_throughput"]), 3),
        "errors": dict(agg),
        "distributions": {"ttft_ms": _ms(ttfts), "tpot_ms": _ms(tpots), "itl_ms": _ms(itls)},
    }


# ------------------------------------------------------------------------------------------------ report
def build(runs: list[dict[str, Any]], config: dict[str, Any]) -> dict[str, Any]:
    """report.json: the headline run's metrics at the top (the only run, or a sweep's highest concurrency),
    `completed`/`failed` summed over every run, and each run under `runs` (with its concurrency)."""
    if not runs:
        raise ValueError("no benchmark run to report")
    head = runs[-1]
    top = {k: v for k, v in head.items() if k not in ("distributions", "concurrency", "workers")}
    top["completed"] = sum(r["completed"] for r in runs)
    top["failed"] = sum(r["failed"] for r in runs)
    return {**top, "config": config,
            "runs": [{k: v for k, v in r.items() if k != "distributions"} for r in runs]}


def get(d: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.2f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def markdown(report: dict[str, Any]) -> str:
    c = report["config"]
    w, p = c["workload"], c["plan"]
    lines = [f"# m3deploy bench: {p['cluster']} ({c['profile']})", "",
             f"{p['model']} {p['variant']} on {p['platform']}, {p['parallel']}, engine {p['engine']}, "
             f"serving {p['serving']}; {p['workers']} worker(s), {p['gpus']} GPU(s), {p['hosts']} host(s); "
             f"Dynamo {p.get('dynamo_version') or '-'}", "",
             f"Workload: {w['endpoint']} endpoint, random input {w['input_len']} / output {w['output_len']} tokens, "
             f"{_prompts(c['profile'], w['num_prompts'])}, "
             f"max concurrency {w['concurrency']}; client {c['client']}; {c['started']} -> {c['finished']}", "",
             f"Plan fingerprint `{c['plan_fingerprint']}`", ""]
    runs = report["runs"]
    cols = ["concurrency", "completed", "failed", "req/s", "out tok/s", "total tok/s", "TTFT p50/p90/p99 (ms)",
            "TPOT p50/p90/p99 (ms)", "ITL p50/p90/p99 (ms)"]
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in runs:
        tri = [" / ".join(fmt(r[k][f"p{q}"]) for q in PCTS) for k in LATENCIES]
        lines.append("| " + " | ".join([str(r.get("concurrency", "-")), fmt(r["completed"]), fmt(r["failed"]),
                                        fmt(r["request_throughput"]), fmt(r["output_throughput_tok_s"]),
                                        fmt(r["total_token_throughput_tok_s"]), *tri]) + " |")
    workers = report.get("workers") or {}
    if workers:
        lines += ["", "Requests per worker (each worker's /metrics `dynamo_component_requests_total`, generate):", ""]
        lines += ["| worker | requests |", "|---|---|"] + [f"| {k} | {v} |" for k, v in sorted(workers.items())]
    lines += serverview.markdown(report.get("server") or {})
    if report.get("errors"):
        lines += ["", "Errors:", ""] + [f"- {n} x {e}" for e, n in report["errors"].items()]
    return "\n".join(lines) + "\n"


def _prompts(profile: str, n: int) -> str:
    if profile != "sweep":
        return f"{n} prompts"
    return f"{n} prompts per step" if n else "10 x concurrency prompts per step"


def compare(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    """Per headline metric: old, new, delta and delta % (new vs old), and whether it got better."""
    rows = []
    for key, label, higher in HEADLINE:
        a, b = get(old, key), get(new, key)
        if a is None or b is None:
            continue
        delta = b - a
        pct = (delta / a * 100.0) if a else None
        better = None if delta == 0 else (delta > 0) == higher
        rows.append({"metric": key, "label": label, "old": a, "new": b, "delta": round(delta, 3),
                     "delta_pct": None if pct is None else round(pct, 1), "better": better})
    return rows


def compare_notes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between the two runs' setups (a delta means little when the workload changed)."""
    notes = []
    for section in ("workload", "plan"):
        a, b = old["config"].get(section, {}), new["config"].get(section, {})
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                notes.append(f"{section}.{k}: {a.get(k)!r} -> {b.get(k)!r}")
    return notes


def compare_markdown(rows: list[dict[str, Any]], notes: list[str], old_dir: str, new_dir: str) -> str:
    lines = ["# m3deploy bench --compare", "", f"old: `{old_dir}`  new: `{new_dir}`", "",
             "| metric | old | new | delta | delta % | |", "|---|---|---|---|---|---|"]
    for r in rows:
        mark = {True: "better", False: "worse", None: ""}[r["better"]]
        pct = "-" if r["delta_pct"] is None else f"{r['delta_pct']:+.1f} %"
        lines.append(f"| {r['label']} | {fmt(r['old'])} | {fmt(r['new'])} | {r['delta']:+,.2f} | {pct} | {mark} |")
    if notes:
        lines += ["", "Setup differences:", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def load(report_dir: str | Path) -> dict[str, Any]:
    f = Path(report_dir) / "report.json"
    if not f.is_file():
        raise FileNotFoundError(f"{f} does not exist: --compare takes the directory of an earlier "
                                f"`m3deploy bench` run (it holds report.json)")
    return json.loads(f.read_text())


# ------------------------------------------------------------------------------------------------ plots
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_latency(runs: list[dict[str, Any]], path: Path, title: str) -> Path:
    """Histograms of TTFT, TPOT and ITL (one run), or one box per concurrency (a sweep)."""
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    labels = {"ttft_ms": "TTFT (ms)", "tpot_ms": "TPOT (ms)", "itl_ms": "ITL (ms)"}
    for ax, key in zip(axes, LATENCIES):
        if len(runs) == 1:
            vals = runs[0]["distributions"][key]
            ax.hist(vals or [0], bins=40, color="#4C72B0")
            for q, style in ((50, "--"), (99, ":")):
                v = runs[0][key][f"p{q}"]
                ax.axvline(v, color="#C44E52", linestyle=style, label=f"p{q} {v:,.1f}")
            ax.set_ylabel("requests" if key != "itl_ms" else "chunk gaps (log scale)")
            if key == "itl_ms":
                ax.set_yscale("log")
            ax.legend(fontsize=8)
        else:  # whiskers at p1 and p99, the tail the report's p99 names
            ax.boxplot([r["distributions"][key] or [0] for r in runs], whis=(1, 99), showfliers=False)
            if key == "itl_ms":
                ax.set_yscale("symlog", linthresh=1.0)
            ax.set_xticks(range(1, len(runs) + 1), [str(r["concurrency"]) for r in runs])
            ax.set_xlabel("max concurrency")
        ax.set_title(labels[key])
        ax.set_xlabel(labels[key] if len(runs) == 1 else "max concurrency")
    fig.suptitle(title)
    return _save(plt, fig, path)


def plot_workers(workers: dict[str, int], path: Path, title: str) -> Path:
    """Requests each worker served during the benchmark (its /metrics counter delta)."""
    plt = _plt()
    names = sorted(workers)
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(names) + 2), 4))
    bars = ax.bar(names, [workers[n] for n in names], color="#55A868")
    ax.bar_label(bars)
    total = sum(workers.values())
    ax.set_ylim(0, max([1, *workers.values()]) * 1.15)  # room for the bar labels
    if names:
        ax.axhline(total / len(names), color="#C44E52", linestyle="--", label=f"even share {total / len(names):,.1f}")
        ax.legend(fontsize=8)
    ax.set_ylabel("requests served (generate)")
    ax.set_title(title, fontsize=10)
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    return _save(plt, fig, path)


def plot_sweep(runs: list[dict[str, Any]], gpus: int, path: Path, title: str) -> Path:
    """Left: throughput vs concurrency. Right: output throughput per GPU vs interactivity (1 / TPOT p50,
    tokens/s per user), each point a concurrency: the curve InferenceX plots."""
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.6))
    conc = [r["concurrency"] for r in runs]
    a.plot(conc, [r["output_throughput_tok_s"] for r in runs], "o-", label="output tok/s")
    a.plot(conc, [r["total_token_throughput_tok_s"] for r in runs], "s--", label="total tok/s")
    a.set_xscale("log", base=2)
    a.set_xticks(conc, [str(c) for c in conc])
    a.set_xlabel("max concurrency")
    a.set_ylabel("tokens / s")
    a.set_title("throughput vs concurrency")
    a.legend(fontsize=8)
    pts = [(1000.0 / r["tpot_ms"]["p50"], r["output_throughput_tok_s"] / max(gpus, 1), r["concurrency"])
           for r in runs if r["tpot_ms"]["p50"] > 0]
    b.plot([x for x, _, _ in pts], [y for _, y, _ in pts], "o-", color="#DD8452")
    for x, y, c in pts:
        b.annotate(f"c={c}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    # TPOT p50 = 0: most requests got every token in the first read; their interactivity is not measurable
    unplotted = [str(r["concurrency"]) for r in runs if not r["tpot_ms"]["p50"] > 0]
    b.set_xlabel("interactivity: 1 / TPOT p50 (tokens/s per user)")
    b.set_ylabel(f"output tokens/s per GPU ({plural(gpus, 'GPU')})")
    b.set_title("throughput per GPU vs interactivity"
                + (f"\n(not plotted, TPOT p50 = 0: c={', '.join(unplotted)})" if unplotted else ""))
    fig.suptitle(title)
    return _save(plt, fig, path)


def plot_compare(rows: list[dict[str, Any]], path: Path, title: str) -> Path:
    """Delta % per headline metric, green when better, red when worse."""
    plt = _plt()
    rows = [r for r in rows if r["delta_pct"] is not None and r["metric"] not in ("completed", "failed")]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.5))
    colors = ["#55A868" if r["better"] else "#C44E52" if r["better"] is False else "#999999" for r in rows]
    bars = ax.barh([r["label"] for r in rows], [r["delta_pct"] for r in rows], color=colors)
    ax.bar_label(bars, labels=[f"{r['delta_pct']:+.1f} %" for r in rows], fontsize=8)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.margins(x=0.2)  # room for the labels of negative bars
    ax.invert_yaxis()
    ax.set_xlabel("new vs old (%)")
    ax.set_title(title)
    return _save(plt, fig, path)
