"""The edge (m3_edge): Debian's haproxy, run by our m3-edge.service, in front of every frontend of the cluster.

Reads (through m3deploy.deploy.context): cluster_plan() (frontends, settings m3_api_key_file); host_plan().services
of kind "edge" (ports, readiness). Files from m3deploy.deploy.edgefiles (haproxy.cfg, edge.pem, the keys' hashes,
the unit); secrets (TLS key, key hashes) from roles/cluster_secrets.secrets_for.

- The package's haproxy.service is masked before the install (its postinst would start it with Debian's config).
- A changed unit restarts the edge; a changed config, certificate or key list only reloads it (`systemctl reload`:
  HAProxy's master starts new workers on the same sockets while the old ones finish: no request is dropped, so a
  key or certificate rotates by a re-run).
- `restart_frontend()` is the planned restart of a frontend behind the edge (roles/frontend.py): drain its server
  on every edge (runtime API, root-only socket), wait until no request is on it, stop it (maint), restart it, wait
  until it is live, lists every planned worker under its running process and has each served model ready, put it
  back (ready) and wait until every edge has it UP. Only then the next frontend (a host's frontends restart one
  after another).
"""
from __future__ import annotations

import shlex
import time

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import python

from m3deploy.check import readiness as _readiness
from m3deploy.check import rollout
from m3deploy.check.checks import instance_services, metrics_url
from m3deploy.check.verify import contract
from m3deploy.core import components, edge
from m3deploy.core.errors import M3Error, plural
from m3deploy.core.inputs import url_host
from m3deploy.deploy import edgefiles, hostfiles
from roles import cluster_secrets, hostops, lifecycle
from roles.hostops import run_on

# the runtime API, from a shell on the host: python3 is on every host (the deploy's own checks use it)
_CLI = ("import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
        "s.sendall(sys.argv[2].encode()+b'\\n'); sys.stdout.write(s.makefile().read())")


@deploy("Deploy the edge")
def deploy_edge():
    cp, hp = lifecycle.plans()
    for s in lifecycle.role_services(hp, __name__):
        c = components.get(s.kind)
        _mask, *files = edgefiles.edge_files(cp, s, cluster_secrets.secrets_for(cp))  # the mask: install ships it
        lifecycle.install(s.kind, mask_name=f"Mask the package's {c.package_unit}")
        *confs, unit_op = [hostops.ship(f) for f in files]
        # RELOAD: the unit restarts; its config, certificate or keys reload (hitless)
        reload = ("config, certificate or keys changed: hitless", confs) if c.lifecycle.activate == components.RELOAD \
            else None
        started = lifecycle.activate(s.unit, unit_op, [unit_op, lifecycle.changes(s)[0]], why="its unit changed",
                                     reload=reload)
        lifecycle.wait_ready(s, started)


def runtime(host_name: str, command: str) -> tuple[bool, str]:
    """One command to the edge's runtime API on `host_name` (False, why: when it has no edge running yet)."""
    sock = shlex.quote(edge.EDGE_SOCKET)
    return run_on(host_name, f"[ -S {sock} ] || {{ echo 'no edge socket {edge.EDGE_SOCKET}'; exit 3; }}; "
                           f"python3 -c {shlex.quote(_CLI)} {sock} {shlex.quote(command)}")


def server_stat(out: str, server: str) -> dict[str, str]:
    """The row of `show stat` (CSV, header `# pxname,svname,...`) for backend `frontends` server `server`."""
    lines = [ln for ln in out.splitlines() if ln.strip()]
    if not lines or not lines[0].startswith("# "):
        return {}
    head = lines[0][2:].split(",")
    for ln in lines[1:]:
        row = dict(zip(head, ln.split(",")))
        if row.get("pxname") == edge.BACKEND and row.get("svname") == server:
            return row
    return {}


def edges(cp) -> list[str]:
    return [h.name for h in cp.hosts if any(s.kind == "edge" for s in h.services)]


def _set_state(cp, name: str, state_: str) -> list[str]:
    """`set server frontends/NAME state STATE` on every running edge; returns the edges that took it."""
    took = []
    for e in edges(cp):
        ok, out = runtime(e, f"set server {edge.BACKEND}/{name} state {state_}")
        if ok and not out.strip():
            took.append(e)
        elif ok:
            raise M3Error(f"edge on {e}: `set server {edge.BACKEND}/{name} state {state_}`: {out.strip()[:200]}")
    return took


def _wait_stat(cp, on: list[str], name: str, want, what: str, timeout_s: float) -> float:
    t0 = time.monotonic()
    while True:
        rows = {e: server_stat(runtime(e, "show stat")[1], name) for e in on}
        if all(want(r) for r in rows.values()):
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            seen = "; ".join(f"{e}: status {r.get('status', '?')}, {r.get('scur', '?')} on it" for e, r in rows.items())
            raise M3Error(f"{name}: {what} after {timeout_s:.0f} s ({seen}). Fix: on the edge host, "
                          f"`journalctl -u {edge.EDGE_UNIT}`; the frontend's journal")
        time.sleep(0.25)


def _drained_restart(cp, s) -> None:
    name = edge.server_name(s)
    on = _set_state(cp, name, "drain")  # no new request; those on it finish
    if on:
        took = _wait_stat(cp, on, name, lambda r: r.get("scur") == "0", "requests still on it",
                          hostfiles.stop_timeout_s(s))
        host.log(f"{name}: drained at {plural(len(on), 'edge')} in {took:.1f} s")
        _set_state(cp, name, "maint")
    unit = shlex.quote(s.unit)
    ok, out = run_on(host.name, f"systemctl enable {unit} 2>&1 && systemctl restart {unit} 2>&1")
    if not ok:
        raise M3Error(f"systemctl restart {s.unit} on {host.name}: {out[-300:]}")
    _readiness.wait_ready(s.readiness, what=f"{s.unit} on {s.host}", logs=hostops.journal_tail(s.unit))
    if on:  # a running cluster (on a first deploy no edge runs yet, and the workers start later)
        port = next(p for p in s.ports if p.name == "http")
        health = f"http://{url_host(port.address)}:{port.port}/health"
        heads = {f"{h.name}/{w.name}": metrics_url(h, w) for h, w in instance_services(cp)}
        took = rollout.wait_workers(health, {k: v for k, v in heads.items() if v},
                                    timeout_s=s.readiness.timeout_s if s.readiness else 120)
        host.log(f"{s.unit}: lists every planned worker ({took:.1f} s)")
        base = f"http://{url_host(port.address)}:{port.port}"
        for model in contract.served_models(cp):  # listed is not routable (a 404 "Model not found" until then)
            took = _readiness.wait_model_ready(base, model, timeout_s=s.readiness.timeout_s if s.readiness else 120)
            host.log(f"{s.unit}: {model} ready ({took:.1f} s)")
        _set_state(cp, name, "ready")
        took = _wait_stat(cp, on, name, lambda r: r.get("status", "").startswith("UP"), "not UP at the edge", 60)
        host.log(f"{name}: back in the edge(s), UP ({took:.1f} s)")


def restart_frontend(cp, s, unit_op, changed_ops):
    """roles/lifecycle.activate for a frontend behind the edge: the restart drained (see module doc)."""
    return lifecycle.activate(s.unit, unit_op, changed_ops, restart=lambda changed: python.call(
        name=f"Restart {s.unit} drained at the edge (its files changed)", function=_drained_restart, cp=cp, s=s,
        _if=changed))
