#!/usr/bin/env python3
"""m3deploy's actuator for Dynamo's planner in `environment: virtual` (m3_planner; docs/PLANNER.md).

Runs on the first control host under systemd (m3-planner-actuator.service), by the host's Dynamo 1.6.1 venv, with
the cluster's etcd credentials from its 0600 env file (ETCD_ENDPOINTS, ETCD_AUTH_USERNAME/PASSWORD: the Dynamo
runtime reads them itself). It reads each decision with Dynamo's own client (`dynamo._core.VirtualConnectorClient`:
`get()` -> PlannerDecision(num_prefill_workers, num_decode_workers, decision_id), `complete()`, which
writes `v1/<namespace>/planner/scaled_decision_id`; rust/planner.rs of ai-dynamo-runtime 1.6.1) and carries it out:
- the aggregated pool's target is `num_decode_workers` (the planner's AggPlanner scales the decode role), clamped
  to [min, max]; the always-on workers serve anyway, so `target - always_on` standby hosts must serve;
- it orders the standby hosts' prepared worker units started (scale out) or drained and stopped (scale in, the last
  started first), one host at a time: it answers GET /orders on the control host's cluster address
  ({"hosts": {name: serve?}}), which the agent on each standby host (files/m3-standby-agent.py, root) polls and
  carries out with systemctl on the units the plan installed there (stop = Dynamo's drain); no credential leaves
  the control host and no host can order another one's units;
- after each order it waits until the host's workers answer /health (start) or none does (drained and gone), then
  acknowledges the decision; within the cool-down after an action it does not act (nor acknowledge: the planner
  holds new decisions until then);
- `decision_id` of the last decision it handled is kept in its state file (written atomically): that decision is
  never acted on again, across restarts of the actuator. The etcd keys hang on the publishing planner's lease
  (seen on the testbed: gone when it exits), so a restarted planner starts its ids at 0 again (rust/planner.rs
  load_current_state finds nothing): since the coordinator's ids only grow and the client only ever sees the latest,
  an id below the last handled one is a new planner's first decisions and is acted on (logged as such).
Every decision and action is logged to the journal (stdout), one line each, prefixed `decision` / `action`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.request

# ------------------------------------------------------------------------------------ the decision (pure)


def clamp(n: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, n))


def decide(decision: tuple[int, int], state: dict, conf: dict, now: float) -> tuple[str, int, str]:
    """(verb, standby hosts to serve, why). decision = (num_decode_workers, decision_id); verbs:
    'none' (no decision yet), 'stale' (already handled: never act), 'ack' (nothing to change: acknowledge),
    'wait' (within the cool-down: act later), 'scale' (make that many standby hosts serve)."""
    want, did = decision
    active = int(state.get("active", 0))
    if did < 0 or want < 0:
        return "none", active, "the planner has published no decision yet"
    acted = int(state.get("acted_id", -1))
    if did == acted:
        return "stale", active, f"decision {did} was handled already"
    restarted = did < acted  # the coordinator's ids only grow; a lower one is a new planner's (see the docstring)
    target = clamp(want, int(conf["min"]), int(conf["max"]))
    n = clamp(target - int(conf["always_on"]), 0, len(conf["standby"]))
    why = (f"planner wants {want}, bounds [{conf['min']}, {conf['max']}] -> {target} workers, {n} standby serving"
           + (f" (ids restarted below {acted}: a new planner)" if restarted else ""))
    if n == active:
        return "ack", n, why + " (as now)"
    left = float(conf["cooldown_s"]) - (now - float(state.get("last_action_t", 0)))
    if left > 0:
        return "wait", n, why + f"; cool-down: {left:.0f} s left"
    return "scale", n, why


def steps(active: int, n: int, standby: list[dict]) -> list[tuple[str, dict]]:
    """('start'|'stop', host) in order: start the next hosts up; stop the last started first."""
    if n > active:
        return [("start", h) for h in standby[active:n]]
    return [("stop", h) for h in reversed(standby[n:active])]


# ------------------------------------------------------------------------------------------- the state


def load_state(path: str) -> dict:
    try:
        with open(path) as f:
            doc = json.load(f)
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}


def save_state(path: str, state: dict) -> None:
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(state, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------- the hosts


def orders(standby: list[dict], active: int) -> dict[str, bool]:
    """{host: serve?}: the first `active` standby hosts serve (the order each standby agent polls)."""
    return {h["host"]: i < active for i, h in enumerate(standby)}


class Orders:
    """What GET /orders answers the standby agents (files/m3-standby-agent.py): {"hosts": {name: bool}}."""

    def __init__(self, standby: list[dict], active: int):
        self.standby, self.doc = standby, orders(standby, active)

    def set(self, active: int) -> None:
        self.doc = orders(self.standby, active)

    def serve(self, address: str, port: int) -> None:
        import http.server
        import threading

        box = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                body = json.dumps({"hosts": box.doc}).encode() if self.path == "/orders" else b""
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # the agents poll every 2 s: not journal lines
                pass

        srv = http.server.ThreadingHTTPServer((address, port), Handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()


def log(kind: str, msg: str) -> None:
    print(f"{kind}: {msg}", flush=True)


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return r.status == 200
    except OSError:
        return False


def wait_until(urls: list[str], up: bool, timeout_s: float) -> bool:
    """Every URL answers 200 (up) or none does (down: the worker unregistered and exited), within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(healthy(u) == up for u in urls):
            return True
        time.sleep(1)
    return False


def carry_out(conf: dict, box: Orders, active: int, n: int) -> int:
    """Order standby hosts to start or drain, one at a time, until n serve; returns how many serve (it stops at the
    first host that does not follow its order within ready_timeout_s)."""
    for verb, h in steps(active, n, conf["standby"]):
        t0 = time.monotonic()
        box.set(active + 1 if verb == "start" else active - 1)
        log("action", f"{verb} {h['host']} ({', '.join(h['units'])}): ordered")
        if not wait_until(h["health"], verb == "start", float(conf["ready_timeout_s"])):
            log("action", f"{verb} {h['host']}: not done after {conf['ready_timeout_s']} s (its /health: "
                          f"{[healthy(u) for u in h['health']]}); stopping here")
            return active + 1 if verb == "start" else active
        active += 1 if verb == "start" else -1
        log("action", f"{verb} {h['host']} done in {time.monotonic() - t0:.1f} s; {active} standby serving")
    return active


# ------------------------------------------------------------------------------------------- the loop


async def run(conf: dict) -> None:
    from dynamo._core import DistributedRuntime, VirtualConnectorClient

    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, os.environ.get("DYN_DISCOVERY_BACKEND", "etcd"),
                                 os.environ.get("DYN_REQUEST_PLANE", "tcp"))
    client = VirtualConnectorClient(runtime, conf["namespace"])
    state = load_state(conf["state_file"])
    box = Orders(conf["standby"], int(state.get("active", 0)))
    box.serve(conf["listen"], int(conf["port"]))
    log("decision", f"actuator up: state {state or '(none)'}; bounds [{conf['min']}, {conf['max']}], "
                    f"{conf['always_on']} always on, {len(conf['standby'])} standby, cool-down {conf['cooldown_s']} s")
    while True:
        d = await client.get()
        verb, n, why = decide((d.num_decode_workers, d.decision_id), state, conf, time.time())
        if verb == "scale" or [d.decision_id, verb] != state.get("logged"):  # each decision's verdict once
            log("decision", f"id {d.decision_id}: {verb}: {why}")
            state["logged"] = [d.decision_id, verb]
        if verb == "scale":
            state["active"] = await asyncio.to_thread(carry_out, conf, box, int(state.get("active", 0)), n)
            state["last_action_t"] = time.time()
        if verb in ("scale", "ack"):
            state["acted_id"] = d.decision_id
            save_state(conf["state_file"], state)
            await client.complete(d)
            log("decision", f"id {d.decision_id}: acknowledged ({state['active'] if 'active' in state else 0} "
                            "standby serving)")
        # poll, not client.wait(): on the testbed (1.6.1) its watch did not wake on the coordinator's puts, and a
        # timed-out wait() cannot be cancelled (the Rust future ignores it), so it hung the loop; get() is one etcd
        # range read
        await asyncio.sleep(float(conf.get("poll_s", 2)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="the actuator's JSON config (m3deploy.core.planner)")
    args = ap.parse_args(argv)
    with open(args.config) as f:
        conf = json.load(f)
    asyncio.run(run(conf))
    return 0


if __name__ == "__main__":
    sys.exit(main())
