"""m3_planner's schema (docs/PLANNER.md): its keys, their defaults and the shape check m3deploy.core.inputs runs.

Pure and import-free so that m3deploy.core.inputs can check the setting before the plan (m3deploy.core.planner)
is built.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# m3_planner's keys: (type, default, meaning); None = derived from the inventory (docs/INVENTORY.md)
FIELDS: dict[str, tuple[Any, Any, str]] = {
    "min": (int, None, "fewest aggregated workers (default: the workers not in standby)"),
    "max": (int, None, "most aggregated workers (default: every worker, standby included)"),
    "cooldown_s": (int, 60, "seconds after an action before the actuator acts again"),
    "port": (int, 9087, "the actuator's orders (HTTP GET /orders) on the first control host's cluster address"),
    "ttft_ms": ((int, float), 500, "the planner's time-to-first-token target"),
    "itl_ms": ((int, float), 50, "the planner's inter-token-latency target"),
    "interval_s": (int, 10, "the planner's adjustment interval (load_adjustment_interval_seconds)"),
    "optimization_target": (str, "throughput", "the planner's optimization_target: throughput, latency (its static "
                                               "KV thresholds), load (scale_up/down_kv_pct), sla (needs m3_monitor)"),
    "scale_up_kv_pct": ((int, float), None, "load: a worker's KV use (scheduled + queued, % of its cache) that adds "
                                            "a worker (decode_scale_up_kv_rate)"),
    "scale_down_kv_pct": ((int, float), None, "load: every worker below this KV use (%) removes one "
                                              "(decode_scale_down_kv_rate)"),
    "profile_data": (str, None, "mocker: controller directory holding prefill_raw_data.json and "
                                "decode_raw_data.json, shipped to every worker as --planner-profile-data (the "
                                "committed one: m3deploy/core/data/planner-profile; unset: the mocker's own timing)"),
    "planner": (str, "local", "local: Dynamo's planner runs on the first control host; external: only the "
                              "actuator and agents (the decisions come from a planner run elsewhere)"),
    "aisimulate": (str, "aisimulate==0.13.0", "local: the pip requirement of AISimulate, which the planner imports "
                                              "(ai-dynamo 1.6.1 pins 0.13.0, on NVIDIA's index; PyPI has dev builds "
                                              "only, e.g. aisimulate==0.13.0.dev202610270000000085)"),
}
# What Dynamo 1.6.1's planner imports that ai-dynamo's requirements do not name (m3deploy leaves out aisimulate, a
# placeholder on PyPI, and adds `aisimulate` above): found by starting `python -m dynamo.planner` on the testbed
# (sklearn: core/perf_model/base.py; prometheus_api_client: monitoring/traffic_metrics.py; pmdarima, filterpy,
# prophet: core/load/predictors.py). They go into the planner's host's wheelhouse only (controller/artifacts.py).
PLANNER_REQUIREMENTS = ("scikit-learn", "prometheus-api-client", "pmdarima", "filterpy", "prophet")
TARGETS = ("throughput", "latency", "load", "sla")


def shape_problem(value: Any) -> str:
    """m3_planner's own shape ('' when fine): known keys, types, ranges (m3deploy.core.inputs)."""
    if not isinstance(value, dict):
        return f"expected a dict such as {{'max': 3, 'cooldown_s': 60}}, got {type(value).__name__}"
    unknown = sorted(set(value) - set(FIELDS))
    if unknown:
        return f"unknown key(s) {unknown}. Fix: use only {sorted(FIELDS)}"
    for k, v in value.items():
        typ = FIELDS[k][0]
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, typ):
            return f"{k} = {v!r} is not a {getattr(typ, '__name__', 'number')}. Fix: {k} = {FIELDS[k][1] or 1}"
        low = 0 if k in ("min", "cooldown_s") or k.endswith("_kv_pct") else 1
        if typ is not str and v < low:
            return f"{k} = {v!r} is out of range. Fix: a number >= {low}"
        if k.endswith("_kv_pct") and v > 100:
            return f"{k} = {v} is above 100 (a percentage of the KV cache). Fix: a number in 0-100"
        if k == "port" and not 1024 <= v <= 65535:
            return f"port = {v} is not a TCP port in 1024-65535. Fix: e.g. port = 9087"
    ais = value.get("aisimulate")
    if ais is not None and not re.fullmatch(r"aisimulate\s*(?:[=<>!~]=?\s*[0-9][0-9A-Za-z.+-]*\s*,?\s*)*", ais):
        return (f"aisimulate = {ais!r} is not a pip requirement of the aisimulate package. Fix: e.g. "
                "'aisimulate==0.13.0.dev202610270000000085'")
    if value.get("planner") not in (None, "local", "external"):
        return f"planner = {value['planner']!r} is not 'local' or 'external'. Fix: planner = 'local'"
    if value.get("optimization_target") not in (None, *TARGETS):
        return (f"optimization_target = {value['optimization_target']!r} is not one of {', '.join(TARGETS)}. Fix: "
                "'throughput' (the default)")
    load = value.get("optimization_target") == "load"
    up, down = value.get("scale_up_kv_pct"), value.get("scale_down_kv_pct")
    if load and (up is None or down is None or up <= down):
        return ("optimization_target 'load' needs scale_up_kv_pct > scale_down_kv_pct (PlannerConfig's "
                "decode_scale_up_kv_rate / decode_scale_down_kv_rate). Fix: e.g. 'scale_up_kv_pct': 60, "
                "'scale_down_kv_pct': 20")
    if not load and (up is not None or down is not None):
        return "scale_up_kv_pct / scale_down_kv_pct apply only to optimization_target 'load'. Fix: remove them"
    return ""


def settings_of(s: Mapping[str, Any]) -> dict[str, Any]:
    """m3_planner with every default filled in (min/max stay None: bounds() derives them)."""
    raw = dict(s.get("m3_planner") or {})
    return {k: raw[k] if raw.get(k) is not None else d for k, (_, d, _) in FIELDS.items()}


def bounds(p: Mapping[str, Any], always_on: int, standby: int) -> tuple[int, int]:
    return (always_on if p["min"] is None else int(p["min"]),
            always_on + standby if p["max"] is None else int(p["max"]))




def wheel_requirements(s: Mapping[str, Any]) -> tuple[str, ...]:
    """What the host running Dynamo's planner needs in its venv beyond ai-dynamo's own requirements."""
    return (settings_of(s)["aisimulate"], *PLANNER_REQUIREMENTS)
