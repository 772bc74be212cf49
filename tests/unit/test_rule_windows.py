"""Rule and dashboard windows follow m3_monitor_scrape_interval_s (issue 35): every range vector spans at least
monitor.MIN_SAMPLES scrape intervals, so rate() and increase() still answer when the interval is long (the schema
allows up to 3600 s; with fixed 1 m / 5 m windows they returned nothing above 30 s).

The promtool cases run Prometheus's own rule engine (`promtool test rules`, Debian's prometheus package, installed
by scripts/install-deps.sh) on the generated rules file, with samples one scrape interval apart, at 15 s and 120 s.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from m3deploy.core import monitor
from m3deploy.core.build import build
from m3deploy.core.inventory import load_inventory

REPO = Path(__file__).resolve().parents[2]
_RANGE = re.compile(r"\[(\d+)([smh])\]")
_S = {"s": 1, "m": 60, "h": 3600}


def plan(interval: int):
    inv = load_inventory(REPO / "inventories" / "gb200.py",
                         override_data={"m3_monitor": True, "m3_monitor_scrape_interval_s": interval})
    return build(inv, name="gb200")


def _exprs(p) -> list[str]:
    rules = [r["expr"] for g in monitor.rules(p)["groups"] for r in g["rules"]]
    panels = [t["expr"] for d in monitor.dashboards(p).values() for panel in d["panels"] for t in panel["targets"]]
    return rules + panels


@pytest.mark.parametrize("interval", [15, 30, 60, 120, 3600])
def test_every_range_spans_at_least_four_scrape_intervals(interval):
    ranges = [int(n) * _S[u] for e in _exprs(plan(interval)) for n, u in _RANGE.findall(e)]
    assert ranges, "no range vector found: the test reads the wrong files"
    assert min(ranges) >= monitor.MIN_SAMPLES * interval, sorted(set(ranges))


def test_the_default_interval_keeps_the_familiar_windows():
    exprs = " ".join(_exprs(plan(15)))
    assert "[1m]" in exprs and "[5m]" in exprs and "[15m]" in exprs


def _promtool() -> str:
    exe = shutil.which("promtool")
    if not exe:
        pytest.fail("promtool missing: `apt-get install prometheus` (scripts/install-deps.sh installs it)")
    return exe


@pytest.mark.parametrize("interval", [15, 120])
def test_prometheus_evaluates_the_rules_at_this_scrape_interval(interval, tmp_path):
    p = plan(interval)
    (tmp_path / "rules.yml").write_text(monitor.to_yaml(monitor.rules(p)))
    step = f"{interval}s"
    n = 40  # samples: 40 intervals of history
    end = f"{n * interval}s"
    case = {
        "rule_files": ["rules.yml"], "evaluation_interval": step,
        "tests": [{
            "interval": step,
            "input_series": [
                # one request per second, one scrape every interval
                {"series": f'{monitor.FE_REQUESTS}{{model="m",status="success"}}', "values": f"0+{interval}x{n}"},
                {"series": f'{monitor.NATS_SLOW_CONSUMERS}{{host="c1"}}', "values": f"0+1x{n}"},
            ],
            "promql_expr_test": [{"expr": "m3:frontend_requests:rate1m", "eval_time": end,
                                  "exp_samples": [{"labels": 'm3:frontend_requests:rate1m{model="m"}', "value": 1}]}],
            "alert_rule_test": [{"eval_time": end, "alertname": "M3NatsSlowConsumers", "exp_alerts": [{
                "exp_labels": {"severity": "warning", "host": "c1"},
                "exp_annotations": {"summary": "NATS on c1 has slow consumers"}}]}],
        }],
    }
    (tmp_path / "case.yml").write_text(yaml.safe_dump(case, sort_keys=False))
    r = subprocess.run([_promtool(), "test", "rules", "case.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
