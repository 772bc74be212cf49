"""Post-deploy verification, generated from the same plan the deploy carried out.

    m3deploy verify INVENTORY [--host H] [--skip-smoke] [--report FILE] [--json]
    pytest tests/verify --inventory INVENTORY            # the same checks as pytest tests

Every check is derived from the ClusterPlan (m3deploy.plan.build), never hard-coded:

- over SSH (testinfra's `ssh` backend, one multiplexed connection per host):
  `unit/...` every planned unit active and enabled; `port/...` every planned port listening on its
  planned address and on no wildcard address unless planned; `file/...` every env file 0600 root:root;
  `secrets/...` no secret value in a world-readable file (unit files, nats.conf), the controller's
  secrets store 0600.
- from the controller (like the deploy's readiness polling): `health/...` each service's readiness
  URL (etcd /health says healthy, NATS /healthz?js-enabled-only=true, frontend /live, worker system-port
  /health); `instances/...` the frontend's /health lists every planned worker instance (endpoint
  "generate") on the planned worker addresses.
- smoke requests through the frontend (m3deploy.smoke).

A check is a function returning its evidence (a short string) or raising CheckFailed(evidence). The
report lists each check, PASS/FAIL, the evidence, and for failures a command that reproduces it.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import click

from .errors import M3Error
from .model import ClusterPlan, HostPlan, Readiness, Service

WILDCARDS = ("0.0.0.0", "::", "*")
GROUPS = ("unit", "port", "file", "secrets", "health", "instances", "smoke")


class CheckFailed(AssertionError):
    """A check's expectation does not hold; the message is the evidence."""


@dataclass(frozen=True)
class Check:
    id: str  # stable: "<group>/<host>/<service>[/<port>]"; also the pytest id
    group: str  # one of GROUPS
    target: str  # host name, or "frontend"/"controller"
    title: str  # what is expected, in words
    fn: Callable[["Context"], str] = field(compare=False, repr=False)
    reproduce: str = ""  # a shell command that shows the same thing by hand
    ssh: bool = False  # needs an SSH connection to `target`


@dataclass
class Result:
    id: str
    group: str
    target: str
    title: str
    ok: bool
    evidence: str
    reproduce: str
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "group": self.group, "target": self.target, "title": self.title,
                "ok": self.ok, "evidence": self.evidence, "reproduce": self.reproduce,
                "seconds": round(self.seconds, 3)}


# ---------------------------------------------------------------------------------------------- ssh
def _q(value: Any) -> str:
    """A value for ssh_config: double-quoted when it has spaces."""
    s = str(value)
    if any(c in s for c in ' \t"'):
        if '"' in s:
            raise M3Error(f"ssh_config value {s!r} contains a double quote; rename the file or host")
        return f'"{s}"'
    return s


def ssh_config_text(hosts: Iterable, control_dir: str, persist_s: int = 60) -> str:
    """ssh_config for testinfra's ssh backend, from the inventory's ssh data (`ssh_hostname`, `ssh_user`,
    `ssh_key`, `ssh_known_hosts_file`, `ssh_port`). Strict host key checking against the inventory's
    known_hosts (no trust on first use) and a ControlPath, so each host gets one multiplexed connection
    (testinfra sets ControlMaster but no ControlPath: without it every check opens a new connection)."""
    out = ["# written by m3deploy verify; removed when it exits", ""]
    for h in hosts:
        d = h.data
        out.append(f"Host {_q(h.name)}")
        out.append(f"  HostName {_q(d.get('ssh_hostname') or h.name)}")
        if d.get("ssh_user"):
            out.append(f"  User {_q(d['ssh_user'])}")
        if d.get("ssh_port"):
            out.append(f"  Port {int(d['ssh_port'])}")
        if d.get("ssh_key"):
            out.append(f"  IdentityFile {_q(os.path.expanduser(str(d['ssh_key'])))}")
            out.append("  IdentitiesOnly yes")
        kh = d.get("ssh_known_hosts_file") or "~/.ssh/known_hosts"
        out.append(f"  UserKnownHostsFile {_q(os.path.expanduser(str(kh)))}")
        out.append("  StrictHostKeyChecking yes")
        out.append("  BatchMode yes")
        out.append("  ConnectTimeout 10")
        out.append("  ControlMaster auto")
        out.append(f"  ControlPath {_q(control_dir)}/%C")
        out.append(f"  ControlPersist {int(persist_s)}s")
        out.append("")
    return "\n".join(out)


def write_ssh_config(hosts: Iterable) -> tuple[str, str]:
    """Write ssh_config (0600) into a fresh 0700 temp dir that also holds the control sockets.
    Returns (config path, dir); Context.close() removes the dir."""
    d = tempfile.mkdtemp(prefix="m3v-")  # mkdtemp makes it 0700
    path = os.path.join(d, "ssh_config")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(ssh_config_text(hosts, d))
    return path, d


def ssh_command(inv_host, command: str) -> str:
    """A copy-pasteable ssh command for the report (no temp files: options spelled out)."""
    d = inv_host.data if inv_host is not None else {}
    argv = ["ssh"]
    if d.get("ssh_key"):
        argv += ["-i", str(d["ssh_key"])]
    if d.get("ssh_port"):
        argv += ["-p", str(d["ssh_port"])]
    if d.get("ssh_known_hosts_file"):
        argv += ["-o", f"UserKnownHostsFile={d['ssh_known_hosts_file']}", "-o", "StrictHostKeyChecking=yes"]
    target = str(d.get("ssh_hostname") or (inv_host.name if inv_host is not None else "HOST"))
    if d.get("ssh_user"):
        target = f"{d['ssh_user']}@{target}"
    return shlex.join(argv + [target, command])


# ---------------------------------------------------------------------------------------------- parsing
@dataclass(frozen=True)
class Listener:
    address: str  # "127.0.0.1", "0.0.0.0", "::", "::1"
    port: int
    process: str = ""  # "etcd,pid=123" when ss -p could tell


def parse_ss(text: str) -> list[Listener]:
    """Parse `ss -Hltnp` (or `ss -ltnp` with its header) into listeners."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4 or parts[0] == "State" or parts[0] == "Netid":
            continue
        if parts[0] in ("tcp", "udp"):  # `ss -a` style with a Netid column
            parts = parts[1:]
        local = parts[3]
        if ":" not in local:
            continue
        addr, _, port = local.rpartition(":")
        addr = addr.strip("[]").split("%", 1)[0]
        if addr == "*":
            addr = "0.0.0.0"
        try:
            p = int(port)
        except ValueError:
            continue
        proc = ""
        users = next((x for x in parts[5:] if x.startswith("users:")), "")
        if users:
            # users:(("etcd",pid=9434,fd=8))
            inner = users[len("users:(("):].split(")", 1)[0]
            bits = inner.split(",")
            name = bits[0].strip('"')
            pid = next((b for b in bits if b.startswith("pid=")), "")
            proc = f"{name},{pid}" if pid else name
        out.append(Listener(addr, p, proc))
    return out


def generate_instances(health: Mapping[str, Any]) -> list[dict]:
    """The instances of the frontend's /health that serve `generate` (one per engine instance)."""
    return [i for i in health.get("instances", []) or [] if i.get("endpoint") == "generate"]


def instance_address(instance: Mapping[str, Any]) -> str:
    """'127.0.0.2' from transport {"tcp": "127.0.0.2:43281/1e0d.../dynamo/backend/generate"} (or nats)."""
    t = instance.get("transport") or {}
    if isinstance(t, dict):
        for v in t.values():
            if isinstance(v, str):
                hostport = v.split("/", 1)[0]
                if "://" in v:
                    hostport = v.split("://", 1)[1].split("/", 1)[0]
                return hostport.rpartition(":")[0].strip("[]") or hostport
    return ""


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Minimal Prometheus text parser: (name, labels, value) per sample; comments skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        labels: dict[str, str] = {}
        if "{" in line:
            name, rest = line.split("{", 1)
            body, _, tail = rest.rpartition("}")
            i = 0
            while i < len(body):
                eq = body.index("=", i)
                key = body[i:eq].strip().lstrip(",").strip()
                j = eq + 2  # skip ="
                val = []
                while j < len(body) and body[j] != '"':
                    if body[j] == "\\" and j + 1 < len(body):
                        j += 1
                        val.append({"n": "\n"}.get(body[j], body[j]))
                    else:
                        val.append(body[j])
                    j += 1
                labels[key] = "".join(val)
                i = j + 1
                while i < len(body) and body[i] in ", ":
                    i += 1
            value = tail.split()[0] if tail.split() else "nan"
        else:
            bits = line.split()
            if len(bits) < 2:
                continue
            name, value = bits[0], bits[1]
        try:
            out.append((name.strip(), labels, float(value)))
        except ValueError:
            continue
    return out


def generate_requests(metrics_text: str) -> dict[str, float]:
    """Per Dynamo worker id (hex, as in the `worker_id` label): requests served on endpoint `generate`
    (`dynamo_component_requests_total`)."""
    out: dict[str, float] = {}
    for name, labels, value in parse_prometheus(metrics_text):
        if name == "dynamo_component_requests_total" and labels.get("dynamo_endpoint") == "generate":
            wid = labels.get("worker_id", "")
            out[wid] = out.get(wid, 0.0) + value
    return out


def worker_id_hex(instance_id: int | str) -> str:
    """Dynamo's /metrics label worker_id is the instance id of /health and nvext in hex."""
    return format(int(instance_id), "x")


# ---------------------------------------------------------------------------------------------- context
class Context:
    """What checks share: the plan, SSH connections (testinfra), HTTP, caches. close() cleans up."""

    def __init__(self, plan: ClusterPlan, inventory: Iterable | None = None, http_timeout: float = 10.0,
                 request_timeout: float = 60.0):
        self.plan = plan
        self.inventory = {h.name: h for h in (inventory or ())}
        self.http_timeout = http_timeout
        self.request_timeout = request_timeout
        self._ssh_config: str | None = None
        self._dir: str | None = None
        self._hosts: dict[str, Any] = {}
        self._listeners: dict[str, list[Listener]] = {}
        self._openai = None
        self._lock = threading.Lock()
        self.cache: dict[str, Any] = {}

    # ssh
    @property
    def ssh_config(self) -> str:
        with self._lock:  # checks of several hosts run in threads: one config, one socket dir
            if self._ssh_config is None:
                if not self.inventory:
                    raise M3Error("SSH checks need the inventory's ssh data (verify INVENTORY)")
                self._ssh_config, self._dir = write_ssh_config(self.inventory.values())
            return self._ssh_config

    def host(self, name: str):
        cfg = self.ssh_config
        with self._lock:
            if name not in self._hosts:
                import testinfra

                self._hosts[name] = testinfra.get_host(f"ssh://{name}", ssh_config=cfg)
            return self._hosts[name]

    def run(self, name: str, command: str):
        """Run on a host; raise CheckFailed when SSH itself fails (exit 255)."""
        try:
            return self.host(name).run(command)
        except RuntimeError as e:  # testinfra raises RuntimeError(CommandResult) on ssh exit 255
            out = getattr(e.args[0], "stderr", "") if e.args else ""
            raise CheckFailed(f"ssh to {name} failed: {(out or str(e)).strip()[:300]}") from None

    def listeners(self, name: str) -> list[Listener]:
        if name not in self._listeners:
            r = self.run(name, "ss -Hltnp")
            if r.rc != 0:
                raise CheckFailed(f"`ss -Hltnp` on {name} exited {r.rc}: {r.stderr.strip()[:200]}")
            self._listeners[name] = parse_ss(r.stdout)
        return self._listeners[name]

    def ssh_reproduce(self, name: str, command: str) -> str:
        return ssh_command(self.inventory.get(name), command)

    # http
    def http_get(self, url: str, timeout: float | None = None) -> tuple[int, str]:
        req = urllib.request.Request(url, headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.http_timeout) as resp:
                return resp.status, resp.read(1 << 20).decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            return e.code, (e.read(65536) if e.fp else b"").decode("utf-8", "replace")
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise CheckFailed(f"GET {url}: {getattr(e, 'reason', e)}") from None

    def openai(self):
        if self._openai is None:
            import httpx
            import openai

            self._openai = openai.OpenAI(base_url=self.plan.endpoint, api_key=os.environ.get("M3_API_KEY", "none"),
                                         timeout=httpx.Timeout(self.request_timeout, connect=5.0), max_retries=0)
        return self._openai

    def close(self) -> None:
        if self._ssh_config:
            for name in self._hosts:
                subprocess.run(["ssh", "-F", self._ssh_config, "-O", "exit", name], capture_output=True,
                               timeout=10, check=False)
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._ssh_config = self._dir = None
        self._hosts.clear()


# ---------------------------------------------------------------------------------------------- checks
def _url_host(h: HostPlan, address: str) -> str:
    return h.address if address in WILDCARDS else address


def frontend(plan: ClusterPlan) -> tuple[HostPlan, Service] | None:
    for h in plan.hosts:
        for s in h.services:
            if s.kind == "frontend":
                return h, s
    return None


def frontend_url(plan: ClusterPlan, path: str) -> str:
    fe = frontend(plan)
    if fe is None:
        return ""
    h, s = fe
    p = next(p for p in s.ports if p.name == "http")
    return f"http://{_url_host(h, p.address)}:{p.port}{path}"


def instance_services(plan: ClusterPlan) -> list[tuple[HostPlan, Service]]:
    """The services that register one `generate` instance each: rank 0 of every planned worker."""
    out = []
    for w in plan.workers:
        hname, sname = w.services[0].split("/", 1)
        h = plan.host(hname)
        out.append((h, h.service(sname)))
    return out


def system_port(h: HostPlan, s: Service) -> int | None:
    return next((p.port for p in s.ports if p.name == "system"), None)


def metrics_url(h: HostPlan, s: Service) -> str:
    p = next((p for p in s.ports if p.name == "system"), None)
    return f"http://{_url_host(h, p.address)}:{p.port}/metrics" if p else ""


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
        if load != "loaded" or active != "active" or enabled != "enabled":
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


def _env_file_check(h: HostPlan, s: Service) -> Callable[[Context], str]:
    def fn(ctx: Context) -> str:
        r = ctx.run(h.name, f"stat -c '%a %U %G %F' {shlex.quote(s.env_file)}")
        if r.rc != 0:
            raise CheckFailed(f"{s.env_file}: {(r.stderr or r.stdout).strip()[:200]}")
        mode, user, group, *kind = r.stdout.split()
        ev = f"{s.env_file} mode {mode} {user}:{group}"
        if " ".join(kind) != "regular file" or int(mode, 8) != 0o600 or (user, group) != ("root", "root"):
            raise CheckFailed(ev + f" ({' '.join(kind)}); want a regular file, mode 600, root:root")
        return ev
    return fn


def _no_leak_check(h: HostPlan, paths: list[str]) -> Callable[[Context], str]:
    def fn(ctx: Context) -> str:
        from .secrets import load_secrets

        values = [v for v in load_secrets(ctx.plan.name).values() if v]
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


def _health_check(s: Service, r: Readiness) -> Callable[[Context], str]:
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


def _instances_check(plan: ClusterPlan, url: str) -> Callable[[Context], str]:
    expected = instance_services(plan)

    def fn(ctx: Context) -> str:
        status, body = ctx.http_get(url)
        if status != 200:
            raise CheckFailed(f"GET {url}: HTTP {status}: {body.strip()[:200]}")
        try:
            inst = generate_instances(json.loads(body))
        except (ValueError, AttributeError):
            raise CheckFailed(f"GET {url}: body is not the frontend's health JSON: {body[:200]}") from None
        want = Counter(_url_host(h, next((p.address for p in s.ports if p.name == "system"), h.address))
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
                title=f"{s.unit} active and enabled", fn=_unit_check(h, s),
                reproduce=rep(f"systemctl status {s.unit} --no-pager; journalctl -u {s.unit} -n 50 --no-pager")))
        for s in h.services:
            for p in s.ports:
                out.append(Check(
                    id=f"port/{h.name}/{s.name}/{p.name}", group="port", target=h.name, ssh=True,
                    title=f"{s.name} listens on {p.address}:{p.port} ({p.name})", fn=_port_check(h, s, p),
                    reproduce=rep(f"ss -ltnp 'sport = :{p.port}'")))
        for s in h.services:
            if s.env_file:
                out.append(Check(
                    id=f"file/{h.name}/{s.name}", group="file", target=h.name, ssh=True,
                    title=f"{s.env_file} is 0600 root:root", fn=_env_file_check(h, s),
                    reproduce=rep(f"stat -c '%a %U:%G %n' {s.env_file}")))
        readable = [f"/etc/systemd/system/{s.unit}" for s in h.services]
        if any(s.kind == "nats" for s in h.services):
            readable.append("/etc/m3/nats.conf")
        if any(s.secret_env for s in h.services):
            out.append(Check(
                id=f"secrets/{h.name}", group="secrets", target=h.name, ssh=True,
                title="no secret value in unit files or nats.conf", fn=_no_leak_check(h, readable),
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
            if r is not None and r.kind == "http" and r.url:
                out.append(Check(
                    id=f"health/{h.name}/{s.name}", group="health", target=h.name,
                    title=f"GET {r.url} answers {r.expect_status}"
                          + "".join(f" with {k}={v}" for k, v in r.expect_json),
                    fn=_health_check(s, r), reproduce=f"curl -sS -i {shlex.quote(r.url)}"))
    fe = frontend(plan)
    if fe is not None and plan.workers and (not only_host or only_host == fe[0].name):
        url = frontend_url(plan, "/health")
        out.append(Check(
            id=f"instances/{fe[0].name}/{fe[1].name}", group="instances", target=fe[0].name,
            title=f"frontend /health lists {len(plan.workers)} generate instance(s) on the planned workers",
            fn=_instances_check(plan, url), reproduce=f"curl -sS {shlex.quote(url)} | python3 -m json.tool"))
    if not only_host and any(s.secret_env for h in plan.hosts for s in h.services):
        from .secrets import secrets_path

        path = str(secrets_path(plan.name))
        if os.path.exists(path):
            out.append(Check(id="secrets/controller", group="secrets", target="controller",
                             title="the controller's secrets store is 0600 in a 0700 dir", fn=_store_check(path),
                             reproduce=f"stat -c '%a %U:%G %n' {shlex.quote(path)} {shlex.quote(os.path.dirname(path))}"))
    return out


def all_checks(plan: ClusterPlan, inventory: Iterable | None = None, only_host: str | None = None,
               smoke: bool = True) -> list[Check]:
    inv = {h.name: h for h in (inventory or ())}
    if only_host and only_host not in {h.name for h in plan.hosts}:
        raise M3Error(f"--host {only_host}: no such host in cluster {plan.name} "
                      f"(hosts: {', '.join(h.name for h in plan.hosts)})")
    checks = host_checks(plan, only_host, inv) + controller_checks(plan, only_host)
    if smoke:
        from . import smoke as smokemod

        checks += smokemod.smoke_checks(plan)
    return checks


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
    if only_host:
        notes.append(f"host checks limited to {only_host} (--host)")
    return notes


# ---------------------------------------------------------------------------------------------- cli
@click.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--host", "only_host", help="Only this host's units, ports, files and health (smoke still runs).")
@click.option("--skip-smoke", is_flag=True, help="No requests through the frontend.")
@click.option("--report", "report", type=click.Path(dir_okay=False), help="Also write the report to FILE "
              "(JSON with --json, else text).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable results (JSON) instead of the table.")
@click.option("--data", multiple=True, metavar="KEY=VALUE", help="Override inventory data (as pyinfra --data).")
def verify(inventory, only_host, skip_smoke, report, as_json, data):
    """Check a deployed cluster against its plan: units, ports, file modes, health, smoke requests.

    Exit status: 0 when every check passed, 1 when any failed, 2 when the plan cannot be built."""
    from rich.console import Console

    from .cli import _parse_data, fail
    from . import plan as planmod

    try:
        inv = planmod.load_inventory(inventory, override_data=_parse_data(data))
        from pathlib import Path

        plan = planmod.build(inv, name=Path(inventory).stem)
        checks = all_checks(plan, inv, only_host, smoke=not skip_smoke)
    except M3Error as e:
        fail(e)
        return
    ctx = Context(plan, inv)
    t0 = time.monotonic()
    try:
        results = run_checks(checks, ctx)
    finally:
        ctx.close()
    took = time.monotonic() - t0
    notes = plan_notes(plan, not skip_smoke, only_host)
    doc = to_json(plan, results, took, notes)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        con = Console()
        if not con.is_terminal:
            con = Console(width=160)
        print_report(results, con, title=f"m3deploy verify {plan.name} ({plan.endpoint})", seconds=took,
                     notes=notes)
    if report:
        with open(report, "w") as f:
            if as_json:
                json.dump(doc, f, indent=2)
                f.write("\n")
            else:
                f.write(render_text(results, title=f"m3deploy verify {plan.name} ({plan.endpoint})", seconds=took,
                                    notes=notes))
    raise SystemExit(0 if doc["ok"] else 1)
