#!/usr/bin/env python3
"""The agent on a standby host (m3_planner; docs/PLANNER.md): carries out the planner actuator's order for this host.

Runs as root under systemd (m3-standby-agent.service), the system python3 (stdlib only). Every 2 s it reads
GET <actuator>/orders ({"hosts": {name: serve?}}, files/m3-planner-actuator.py) and makes this host's prepared
worker units (the plan's, named in its config) follow its own entry: `systemctl start` them when it serves and they
are not active, `systemctl stop` them (Dynamo's drain: SIGTERM, unregister, finish in-flight requests) when it must
not and they are. An unreachable actuator or an unknown answer changes nothing: the units stay as they are.
Every change is logged to the journal, one line each, prefixed `action`.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request


def wanted(doc, host: str):
    """True/False: the order for `host`; None: no valid order for it (change nothing)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("hosts"), dict):
        return None
    v = doc["hosts"].get(host)
    return v if isinstance(v, bool) else None


def active(units: list[str]) -> bool:
    r = subprocess.run(["systemctl", "is-active", "--quiet", *units], check=False)
    return r.returncode == 0


def step(conf: dict, doc) -> str:
    """One poll: the systemctl verb run ('start' | 'stop'), or ''."""
    want = wanted(doc, conf["host"])
    if want is None or want == active(conf["units"]):
        return ""
    verb = "start" if want else "stop"
    t0 = time.monotonic()
    r = subprocess.run(["systemctl", verb, *conf["units"]], capture_output=True, text=True, check=False)
    print(f"action: {verb} {' '.join(conf['units'])}: rc={r.returncode} in {time.monotonic() - t0:.1f} s "
          f"{r.stderr.strip()[:300]}", flush=True)
    return verb


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="JSON: host, units, orders (URL), interval_s")
    args = ap.parse_args(argv)
    with open(args.config) as f:
        conf = json.load(f)
    print(f"action: agent up for {conf['host']} ({' '.join(conf['units'])}), orders from {conf['orders']}", flush=True)
    while True:
        try:
            with urllib.request.urlopen(conf["orders"], timeout=5) as r:
                doc = json.loads(r.read())
        except (OSError, ValueError):
            doc = None
        step(conf, doc)
        time.sleep(float(conf.get("interval_s", 2)))


if __name__ == "__main__":
    sys.exit(main())
