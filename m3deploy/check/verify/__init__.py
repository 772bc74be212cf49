"""Post-deploy verification, generated from the same plan the deploy carried out.

    m3deploy verify INVENTORY [--host H] [--skip-smoke] [--report FILE] [--json]
    pytest tests/verify --inventory INVENTORY            # the same checks as pytest tests

Every check is derived from the ClusterPlan (m3deploy.core.build.build), never hard-coded:

- over SSH (testinfra's `ssh` backend, one multiplexed connection per host):
  `unit/...` every planned unit active and enabled; `port/...` every planned port listening on its
  planned address and on no wildcard address unless planned; `file/...` every env file and secret file (an MPI
  world's SSH keys) 0600 root:root;
  `secrets/...` no secret value in a world-readable file (unit files, nats.conf, config files), the controller's
  secrets store 0600.
- from the controller (like the deploy's readiness polling): `health/...` each service's readiness
  URL (etcd /health says healthy, NATS /healthz?js-enabled-only=true, frontend /live, worker system-port
  /health); `instances/...` the frontend's /health lists every planned worker instance (endpoint
  "generate") on the planned worker addresses.
- `cert/...`: each certificate the controller can see, its days left; fails inside the renewal window
  (m3deploy.check.verify.certs).
- smoke requests through the frontend (m3deploy.check.verify.smoke).

A check is a function returning its evidence (a short string) or raising CheckFailed(evidence). The
report lists each check, PASS/FAIL, the evidence, and for failures a command that reproduces it.
"""
from __future__ import annotations

import json
import os
import posixpath
import shlex
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Mapping

from m3deploy.check import hfcache
from m3deploy.check.checks import (
    WILDCARDS,
    Check,
    CheckFailed,
    Context,
    Result,
    _url_host,
    frontend,
    frontend_url,
    generate_instances,
    instance_address,
    instance_services,
    ssh_command,
)
from m3deploy.core import components, internal_tls
from m3deploy.core.errors import M3Error
from m3deploy.core.model import ClusterPlan, HostPlan, Readiness, Service


def parse_systemctl_show(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def _unit_check(h: HostPlan, s: Service) -> Callable[[Context], str]:
    def fn(ctx: Context) -> str:
        r = ctx.run(h.name, f"systemctl show {shlex.quote(s.unit)} -p LoadState -p ActiveState -p SubState "
                            "-p UnitFileState -p NRestarts")
        st = parse_systemctl_show(r.stdout)
        load, active, sub = st.get("LoadState", "?"), st.get("ActiveState", "?"), st.get("SubState", "?")
        enabled = st.get("UnitFileState") or "?"
        ev = f"{load}, {active} ({sub}), {enabled}"
        if st.get("NRestarts", "0") not in ("0", ""):
            ev += f", restarted {st['NRestarts']}x"
        # a standby worker (m3_planner) is installed, never enabled; the planner's agent starts and stops it
        bad = load != "loaded" or enabled == "enabled" if s.standby else (
            load != "loaded" or active != "active" or enabled != "enabled")
        if bad:
            j = ctx.run(h.name, f"journalctl -u {shlex.quote(s.unit)} -n 3 --no-pager -o cat 2>&1 || true")
            tail = " | ".join(x.strip() for x in j.stdout.strip().splitlines()[-3:])
            raise CheckFailed(ev + (f"; journal: {tail[:300]}" if tail and "No entries" not in tail else ""))
        return ev
    return fn


def _port_check(h: HostPlan, s: Service, port) -> Callable[[Context], str]:
    def fn(ctx: Context) -> str:
        ls = ctx.listeners(h.name)
        on_port = [x for x in ls if x.port == port.port]
        want_wild = port.address in WILDCARDS
        found = [x for x in on_port if x.address == port.address or (want_wild and x.address in WILDCARDS)]
        wild = [x for x in on_port if x.address in WILDCARDS]
        desc = ", ".join(f"{x.address}:{x.port}" + (f" ({x.process})" if x.process else "") for x in on_port)
        if wild and not want_wild:
            raise CheckFailed(f"listens on a wildcard address, planned {port.address} only: {desc}")
        if not found:
            raise CheckFailed(f"nothing listens on {port.address}:{port.port}"
                              + (f"; on port {port.port}: {desc}" if desc else ""))
        return f"listening: {desc}"
    return fn


def _env_file_check(h: HostPlan, path: str, owner: str = "root") -> Callable[[Context], str]:
    """`path` (an env file, or a secret file: an MPI world's SSH keys) is a regular file, 0600 root:root (a TLS file
    of m3_internal_tls: 0600 of the user its service runs as, m3deploy.core.components.user)."""
    def fn(ctx: Context) -> str:
        r = ctx.run(h.name, f"stat -c '%a %U %G %F' {shlex.quote(path)}")
        if r.rc != 0:
            raise CheckFailed(f"{path}: {(r.stderr or r.stdout).strip()[:200]}")
        mode, user, group, *kind = r.stdout.split()
        ev = f"{path} mode {mode} {user}:{group}"
        if " ".join(kind) != "regular file" or int(mode, 8) != 0o600 or (user, group) != (owner, owner):
            raise CheckFailed(ev + f" ({' '.join(kind)}); want a regular file, mode 600, {owner}:{owner}")
        return ev
    return fn


def _weights_check(h: HostPlan, specs: list[str]) -> Callable[[Context], str]:
    """Every repo of the plan's model_repos complete in the host's HF cache (m3deploy.check.hfcache)."""
    def fn(ctx: Context) -> str:
        r = ctx.run(h.name, hfcache.remote_command(f"{h.weights_dir}/hub", specs))
        got = hfcache.parse_output(r.stdout)
        if len(got) != len(specs):
            raise CheckFailed(f"the cache check did not run on {h.name} (exit {r.rc}): "
                              f"{(r.stderr or r.stdout).strip()[:300]}")
        ev = "; ".join(f"{x['repo']}: {x['detail']}" for x in got)
        if not all(x["ok"] for x in got):
            raise CheckFailed(ev + ". Fix: re-run the deploy (the weights role resumes the download)")
        return ev
    return fn


def _record_check(plan: ClusterPlan, h: HostPlan) -> Callable[[Context], str]:
    """The deploy record (m3deploy.controller.deployed) has this host, deployed from this plan."""
    def fn(ctx: Context) -> str:
        from m3deploy.controller import deployed

        record = deployed.load(plan.name)
        entry = (record.get("hosts") or {}).get(h.name)
        if not entry:
            raise CheckFailed(f"{deployed.record_path(plan.name)} has no entry for {h.name}. Fix: run the deploy")
        changes = [x for x in deployed.diff(plan, record) if x.startswith(f"{h.name}:")]
        if changes:
            raise CheckFailed(f"deployed from another plan: {'; '.join(changes)[:400]}. Fix: run the deploy "
                              "(`m3deploy plan --diff-deployed` shows the changes)")
        running = entry.get("running") or {}
        stopped = [n for n, c in (running.get("containers") or {}).items() if not c.get("id")]
        if stopped:
            raise CheckFailed(f"no running container recorded for {', '.join(stopped)}")
        return f"recorded {entry.get('at')}: {deployed.describe_running(entry)}"
    return fn


def _no_leak_check(h: HostPlan, paths: list[str]) -> Callable[[Context], str]:
    def fn(ctx: Context) -> str:
        from m3deploy.controller.secrets import load_secrets

        values = [v for v in [*load_secrets(ctx.plan.name).values(), ctx.api_key] if v]
        if not values:
            return "no secrets in this controller's store: nothing can leak"
        leaked, missing = [], []
        for p in paths:
            r = ctx.run(h.name, f"cat {shlex.quote(p)}")
            if r.rc != 0:
                missing.append(p)
            elif any(v in r.stdout for v in values):
                leaked.append(p)
        if leaked:
            raise CheckFailed(f"a secret value appears in {', '.join(leaked)} (must only be in 0600 env files)")
        ev = f"no secret value in {len(paths) - len(missing)} world-readable file(s)"
        return ev + (f" ({len(missing)} absent: {', '.join(missing)})" if missing else "")
    return fn


def _store_check(path: str) -> Callable[[Context], str]:
    def fn(ctx: Context) -> str:
        st = os.stat(path)
        mode, dmode = st.st_mode & 0o777, os.stat(os.path.dirname(path)).st_mode & 0o777
        ev = f"{path} mode {mode:o}, dir {dmode:o}"
        if mode & 0o077 or dmode & 0o077:
            raise CheckFailed(ev + "; want 600 and a 700 directory")
        return ev
    return fn


HEALTH_TRIES, HEALTH_RETRY_S = 3, 1.0  # a health endpoint asked 3 times, 1 s apart, before it counts as failed


def _health_check(s: Service, r: Readiness) -> Callable[[Context], str]:
    """The service's health endpoint answers as its readiness says. A failed answer is asked again (HEALTH_TRIES,
    HEALTH_RETRY_S apart): etcd's /health answers `{"health":"false"}` when one linearizable read takes over its 1 s
    timeout (its disk stalled under load: seen in CI right after a deploy), which is not what this check is for; a
    recovered answer says so in the evidence."""
    once = _health_once(r)

    def fn(ctx: Context) -> str:
        failed = []
        for i in range(HEALTH_TRIES):
            if i:
                time.sleep(HEALTH_RETRY_S)
            try:
                ev = once(ctx)
            except CheckFailed as e:
                failed.append(str(e))
                continue
            return ev + (f" (try {i + 1} of {HEALTH_TRIES}; before: {failed[0]})" if failed else "")
        raise CheckFailed(f"{failed[-1]} ({HEALTH_TRIES} tries, {HEALTH_RETRY_S:g} s apart)")
    return fn


def _health_once(r: Readiness) -> Callable[[Context], str]:
    def fn(ctx: Context) -> str:
        status, body = ctx.http_get(r.url)
        ev = f"GET {r.url}: HTTP {status}"
        if status != r.expect_status:
            raise CheckFailed(f"{ev} (want {r.expect_status}): {body.strip()[:200]}")
        if r.expect_json:
            try:
                doc = json.loads(body)
            except ValueError:
                raise CheckFailed(f"{ev}; body is not JSON: {body[:200]}") from None
            for key, want in r.expect_json:
                got = doc
                for part in key.split("."):
                    got = got.get(part) if isinstance(got, dict) else None
                if str(got) != str(want):
                    raise CheckFailed(f"{ev}; {key}={got!r} (want {want!r})")
                ev += f", {key}={got}"
        return ev
    return fn


def registered_services(plan: ClusterPlan) -> list[tuple[HostPlan, Service]]:
    """Every service that registers one `generate` instance: the workers' rank 0, plus the testbed's scripted
    tool-call engine (m3deploy.core.simengine)."""
    return instance_services(plan) + [(h, s) for h in plan.hosts for s in h.services if s.kind == "scripted"]


def _instances_check(plan: ClusterPlan, url: str) -> Callable[[Context], str]:
    expected = registered_services(plan)

    def fn(ctx: Context) -> str:
        status, body = ctx.http_get(url)
        if status != 200:
            raise CheckFailed(f"GET {url}: HTTP {status}: {body.strip()[:200]}")
        try:
            inst = generate_instances(json.loads(body))
        except (ValueError, AttributeError):
            raise CheckFailed(f"GET {url}: body is not the frontend's health JSON: {body[:200]}") from None
        want = Counter(_url_host(h, s.port("system").address if s.port("system") else h.address)
                       for h, s in expected)
        got = Counter(instance_address(i) for i in inst)
        names = {(_url_host(h, h.address)): f"{h.name}" for h, _ in expected}
        where = ", ".join(f"{a} x{n}" + (f" ({names[a]})" if a in names else "") for a, n in sorted(got.items()))
        ev = f"{len(inst)} of {len(expected)} generate instance(s): {where or 'none'}"
        if got != want:
            missing = want - got
            extra = got - want
            more = ""
            if missing:
                more += "; missing on " + ", ".join(f"{a} ({names.get(a, '?')}) x{n}" for a, n in missing.items())
            if extra:
                more += "; unplanned on " + ", ".join(f"{a} x{n}" for a, n in extra.items())
            raise CheckFailed(ev + more)
        return ev
    return fn


def host_checks(plan: ClusterPlan, only_host: str | None = None, ctx_inventory: Mapping | None = None) -> list[Check]:
    """Checks over SSH, per host and service, from the plan."""
    inv = ctx_inventory or {}
    out: list[Check] = []
    for h in plan.hosts:
        if only_host and h.name != only_host:
            continue

        def rep(cmd: str, _h=h) -> str:
            return ssh_command(inv.get(_h.name), cmd)

        for s in h.services:
            out.append(Check(
                id=f"unit/{h.name}/{s.name}", group="unit", target=h.name, ssh=True,
                title=f"{s.unit} installed, not enabled (standby: the planner starts it)" if s.standby
                else f"{s.unit} active and enabled", fn=_unit_check(h, s),
                reproduce=rep(f"systemctl status {s.unit} --no-pager; journalctl -u {s.unit} -n 50 --no-pager")))
        for s in h.services:
            for p in () if s.standby else s.ports:
                out.append(Check(
                    id=f"port/{h.name}/{s.name}/{p.name}", group="port", target=h.name, ssh=True,
                    title=f"{s.name} listens on {p.address}:{p.port} ({p.name})", fn=_port_check(h, s, p),
                    reproduce=rep(f"ss -ltnp 'sport = :{p.port}'")))
        for s in h.services:
            refs = dict(s.secret_files)
            for path in ([s.env_file] if s.env_file else []) + [f for f, _ in s.secret_files]:
                owner = components.user(s.kind, s.image) if internal_tls.is_tls_ref(refs.get(path, "")) else "root"
                out.append(Check(
                    id=f"file/{h.name}/{s.name}" + ("" if path == s.env_file else f"/{posixpath.basename(path)}"),
                    group="file", target=h.name, ssh=True,
                    title=f"{path} is 0600 {owner}:{owner}", fn=_env_file_check(h, path, owner),
                    reproduce=rep(f"stat -c '%a %U:%G %n' {path}")))
        if h.weights_dir and h.weights_gb and plan.model_repos:
            folders = " ".join(shlex.quote(str(hfcache.repo_folder(f"{h.weights_dir}/hub", r.repo))) + "/snapshots/*/"
                               for r in plan.model_repos)
            out.append(Check(
                id=f"weights/{h.name}", group="weights", target=h.name, ssh=True,
                title=f"{len(plan.model_repos)} model repo(s) complete in {h.weights_dir}",
                fn=_weights_check(h, [hfcache.spec(r) for r in plan.model_repos]),
                reproduce=rep(f"ls -lL {folders}")))
        readable = [f"/etc/systemd/system/{s.unit}" for s in h.services]
        if any(s.kind == "nats" for s in h.services):
            readable.append("/etc/m3/nats.conf")
        readable += [f for s in h.services for f, _ in s.files]  # the config files a command names
        if any(s.secret_env or s.secret_files for s in h.services):
            out.append(Check(
                id=f"secrets/{h.name}", group="secrets", target=h.name, ssh=True,
                title="no secret value in unit files, nats.conf or config files", fn=_no_leak_check(h, readable),
                reproduce=rep("ls -l " + " ".join(readable))))
    return out


def controller_checks(plan: ClusterPlan, only_host: str | None = None) -> list[Check]:
    """HTTP checks from the controller: each service's readiness URL, the frontend's instance list,
    and the controller's secrets store."""
    out: list[Check] = []
    for h in plan.hosts:
        if only_host and h.name != only_host:
            continue
        for s in h.services:
            r = s.readiness
            if r is not None and r.kind == "http" and r.url and not s.standby:
                out.append(Check(
                    id=f"health/{h.name}/{s.name}", group="health", target=h.name,
                    title=f"GET {r.url} answers {r.expect_status}"
                          + "".join(f" with {k}={v}" for k, v in r.expect_json),
                    fn=_health_check(s, r), reproduce=f"curl -sS -i {shlex.quote(r.url)}"))
        if h.services:
            from m3deploy.controller import deployed

            out.append(Check(id=f"deployed/{h.name}", group="deployed", target=h.name,
                             title="the deploy record has this host, deployed from this plan",
                             fn=_record_check(plan, h),
                             reproduce=f"m3deploy plan INVENTORY --diff-deployed --host {h.name}; "
                                       f"cat {shlex.quote(str(deployed.record_path(plan.name)))}"))
    fe = frontend(plan)
    if fe is not None and plan.workers and (not only_host or only_host == fe[0].name):
        url = frontend_url(plan, "/health")
        out.append(Check(
            id=f"instances/{fe[0].name}/{fe[1].name}", group="instances", target=fe[0].name,
            title=f"frontend /health lists {len(registered_services(plan))} generate instance(s) on the planned "
                  "workers",
            fn=_instances_check(plan, url), reproduce=f"curl -sS {shlex.quote(url)} | python3 -m json.tool"))
    if not only_host and any(s.secret_env for h in plan.hosts for s in h.services):
        from m3deploy.controller.secrets import secrets_path

        path = str(secrets_path(plan.name))
        if os.path.exists(path):
            out.append(Check(id="secrets/controller", group="secrets", target="controller",
                             title="the controller's secrets store is 0600 in a 0700 dir", fn=_store_check(path),
                             reproduce=f"stat -c '%a %U:%G %n' {shlex.quote(path)} "
                                       f"{shlex.quote(os.path.dirname(path))}"))
    return out


def all_checks(plan: ClusterPlan, inventory: Iterable | None = None, only_host: str | None = None,
               smoke: bool = True) -> list[Check]:
    inv = {h.name: h for h in (inventory or ())}
    if only_host and only_host not in {h.name for h in plan.hosts}:
        raise M3Error(f"--host {only_host}: no such host in cluster {plan.name} "
                      f"(hosts: {', '.join(h.name for h in plan.hosts)})")
    from m3deploy.check.verify.certs import cert_checks
    from m3deploy.check.verify.cluster_tls import tls_checks
    from m3deploy.check.verify.edge import edge_checks

    checks = host_checks(plan, only_host, inv) + controller_checks(plan, only_host) + edge_checks(plan, inv, only_host)
    checks += tls_checks(plan, only_host)  # m3_internal_tls: etcd and NATS refuse clients without a certificate
    checks += cert_checks(plan, only_host)  # each certificate's days left (m3deploy.controller.certs)
    if not only_host:  # m3_monitor: Prometheus scrapes every target, loads the rules, counts pinned requests
        from m3deploy.check.verify.metrics import metrics_checks

        checks += metrics_checks(plan)
    if smoke:
        from m3deploy.check.verify import contract, identity
        from m3deploy.check.verify import smoke as smokemod
        from m3deploy.check.verify.disagg import disagg_checks

        # smoke_checks opens with smoke/identity; the contract's and disagg's checks count only after it passed
        checks += smokemod.smoke_checks(plan) + identity.gated(contract.contract_checks(plan) + disagg_checks(plan))
    return checks


def nothing_deployed(plan: ClusterPlan, only_host: str | None = None, inventory: str = "INVENTORY") -> str:
    """One line when the deploy record (m3deploy.controller.deployed) has none of the plan's hosts (none deployed
    from this controller, or the cluster's name changed): then every check would wait on services that were never
    installed. "" when at least one host is recorded (the others fail their own `deployed/HOST` check)."""
    from m3deploy.controller import deployed

    path = deployed.record_path(plan.name)
    recorded = (deployed.load(plan.name).get("hosts") or {}).keys()
    want = [h.name for h in plan.hosts if h.services and (not only_host or h.name == only_host)]
    if not want or set(want) & set(recorded):
        return ""
    fix = f"Fix: deploy first (pyinfra -y {inventory} deploy.py), or name the cluster the deploy used (m3_cluster)"
    if not recorded:
        return f"nothing deployed for cluster {plan.name}: no deploy record {path}. {fix}"
    return (f"nothing deployed for cluster {plan.name}: the deploy record {path} has none of its hosts "
            f"{', '.join(want)} (it has {', '.join(sorted(recorded))}). {fix}")


# ---------------------------------------------------------------------------------------------- running
def run_check(check: Check, ctx: Context) -> Result:
    t0 = time.monotonic()
    try:
        ev, ok = check.fn(ctx), True
    except CheckFailed as e:
        ev, ok = str(e), False
    except Exception as e:  # noqa: BLE001 - a check that crashes is a failed check, with the reason
        ev, ok = f"{type(e).__name__}: {e}", False
    return Result(check.id, check.group, check.target, check.title, ok, " ".join(str(ev).split()),
                  check.reproduce, time.monotonic() - t0)


def run_checks(checks: list[Check], ctx: Context, parallel: int = 8) -> list[Result]:
    """SSH checks run one thread per host (each host's checks in order); then the rest in order."""
    results: dict[str, Result] = {}
    by_host: dict[str, list[Check]] = {}
    for c in checks:
        if c.ssh:
            by_host.setdefault(c.target, []).append(c)
    if by_host:
        def host_run(cs: list[Check]) -> list[Result]:
            return [run_check(c, ctx) for c in cs]

        with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(by_host)))) as ex:
            for rs in ex.map(host_run, by_host.values()):
                for r in rs:
                    results[r.id] = r
    for c in checks:
        if not c.ssh:
            results[c.id] = run_check(c, ctx)
    return [results[c.id] for c in checks]


# ---------------------------------------------------------------------------------------------- report
def render_table(results: list[Result], title: str = "m3deploy verify"):
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=title, show_lines=False, expand=False)
    t.add_column("check", overflow="fold")
    t.add_column("result", no_wrap=True)
    t.add_column("evidence", overflow="fold")
    t.add_column("s", justify="right", no_wrap=True)
    for r in results:
        t.add_row(escape(r.id), "[green]PASS[/green]" if r.ok else "[bold red]FAIL[/bold red]", escape(r.evidence),
                  f"{r.seconds:.2f}")
    return t


def summary(results: list[Result], seconds: float | None = None) -> str:
    failed = sum(1 for r in results if not r.ok)
    s = f"{len(results) - failed} passed, {failed} failed"
    if seconds is not None:
        s += f" in {seconds:.1f} s"
    return s


def print_report(results: list[Result], console, title: str = "m3deploy verify", seconds: float | None = None,
                 notes: Iterable[str] = ()) -> None:
    from rich.markup import escape

    console.print(render_table(results, title))
    failed = [r for r in results if not r.ok]
    if failed:
        console.print("\n[bold]Failed checks: reproduce by hand[/bold]")
        for r in failed:
            console.print(f"[red]{escape(r.id)}[/red] ({escape(r.title)})", highlight=False)
            console.print(f"  {r.reproduce}", markup=False, highlight=False, soft_wrap=True)
    for n in notes:
        console.print(f"note: {n}", markup=False, highlight=False)
    console.print(("[green]" if not failed else "[bold red]") + summary(results, seconds)
                  + ("[/green]" if not failed else "[/bold red]"))


def render_text(results: list[Result], width: int = 160, **kw) -> str:
    """The report as plain text (for files, logs and assertion messages)."""
    from rich.console import Console

    con = Console(record=True, width=width, file=open(os.devnull, "w"), color_system=None)
    print_report(results, con, **kw)
    return con.export_text()


def to_json(plan: ClusterPlan, results: list[Result], seconds: float, notes: Iterable[str] = ()) -> dict[str, Any]:
    return {"cluster": plan.name, "endpoint": plan.endpoint, "ok": all(r.ok for r in results),
            "passed": sum(r.ok for r in results), "failed": sum(not r.ok for r in results),
            "seconds": round(seconds, 2), "notes": list(notes), "results": [r.to_dict() for r in results]}


def plan_notes(plan: ClusterPlan, smoke: bool, only_host: str | None) -> list[str]:
    notes = []
    if not smoke:
        notes.append("smoke requests skipped (--skip-smoke)")
    elif frontend(plan) is None:
        notes.append("no Dynamo frontend in this plan: session-affinity checks do not apply")
    elif len(plan.workers) < 2:
        notes.append("one worker: session spread over workers cannot be shown (stickiness still is)")
    from m3deploy.check.verify.contract import random_weights

    if smoke and random_weights(plan):
        notes.append(f"{plan.engine}'s CPU build serves the testbed's random-weights model: smoke/reasoning-split and "
                     "smoke/tool-call do not apply (such a model never closes a think block or calls a tool)")
    if only_host:
        notes.append(f"host checks limited to {only_host} (--host)")
    return notes


