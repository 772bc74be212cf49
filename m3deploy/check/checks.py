"""What every verification shares: a Check and its Result, SSH to the hosts, parsers of what the hosts and the
frontend answer, the run Context, and the plan lookups (frontend, instances, metrics URLs). m3deploy.check.verify
builds the checks from them; m3deploy.check.verify.smoke its requests.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from m3deploy.controller import tls
from m3deploy.controller.secrets import api_key
from m3deploy.core.connection import sudo_args
from m3deploy.core.disagg import pool_of
from m3deploy.core.errors import M3Error
from m3deploy.core.inputs import control_chars, url_host
from m3deploy.core.model import ClusterPlan, HostPlan, Service

WILDCARDS = ("0.0.0.0", "::", "*")
GROUPS = ("unit", "port", "file", "secrets", "health", "instances", "smoke", "metrics")


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
    if control_chars(s):  # a newline would start a new ssh_config option (a ProxyCommand runs on the controller)
        raise M3Error(f"ssh_config value {s!r} holds {control_chars(s)}; fix the inventory (m3deploy validate)")
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


def ssh_argv(d) -> list[str]:
    """`ssh` and the options of an inventory host's ssh data (key, port, known_hosts: strict checking)."""
    argv = ["ssh"]
    if d.get("ssh_key"):
        argv += ["-i", str(d.get("ssh_key"))]
    if d.get("ssh_port"):
        argv += ["-p", str(d.get("ssh_port"))]
    if d.get("ssh_known_hosts_file"):
        argv += ["-o", f"UserKnownHostsFile={d.get('ssh_known_hosts_file')}", "-o", "StrictHostKeyChecking=yes"]
    return argv


def ssh_target(d, name: str) -> str:
    target = str(d.get("ssh_hostname") or name)
    return f"{d.get('ssh_user')}@{target}" if d.get("ssh_user") else target


def ssh_command(inv_host, command: str) -> str:
    """A copy-pasteable ssh command for the report (no temp files: options spelled out)."""
    d = inv_host.data if inv_host is not None else {}
    target = ssh_target(d, inv_host.name if inv_host is not None else "HOST")
    if sudo_args(d).get("_sudo"):
        command = f"sudo sh -c {shlex.quote(command)}"
    return shlex.join(ssh_argv(d) + [target, command])


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
        self.api_key = api_key(plan)  # m3_api_key_file (M3Error when unreadable or not 0600), else None
        self.tls = tls.trust(plan)  # HTTPS to the edge, verified with the cluster's CA (m3deploy.controller.tls)
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

                d = self.inventory[name].data if name in self.inventory else {}
                sudo = sudo_args(d)  # a non-root login user with sudo (`_sudo`): the checks run under sudo
                kw = {"sudo": True, **({"sudo_user": sudo["_sudo_user"]} if sudo.get("_sudo_user") else {})} \
                    if sudo.get("_sudo") else {}
                self._hosts[name] = testinfra.get_host(f"ssh://{name}", ssh_config=cfg, **kw)
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
    def http_get(self, url: str, timeout: float | None = None, headers: dict | None = None) -> tuple[int, str]:
        req = urllib.request.Request(url, headers={"Accept": "application/json", **(headers or {})})
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

            key = self.api_key or os.environ.get("M3_API_KEY", "none")
            self._openai = openai.OpenAI(base_url=self.plan.endpoint, api_key=key,
                                         timeout=httpx.Timeout(self.request_timeout, connect=5.0), max_retries=0,
                                         **({"http_client": httpx.Client(verify=self.tls)} if self.tls else {}))
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
    return url_host(h.address if address in WILDCARDS else address)


def frontend(plan: ClusterPlan) -> tuple[HostPlan, Service] | None:
    return plan.first("frontend")


def frontend_url(plan: ClusterPlan, path: str) -> str:
    fe = frontend(plan)
    if fe is None:
        return ""
    h, s = fe
    p = s.port("http")
    return f"http://{_url_host(h, p.address)}:{p.port}{path}"


def frontend_urls(plan: ClusterPlan, path: str) -> list[str]:
    """`path` on every Dynamo frontend of the plan (host order; m3_edge's extra frontends too)."""
    out = []
    for h in plan.hosts:
        for s in h.services:
            if s.kind == "frontend":
                p = s.port("http")
                out.append(f"http://{_url_host(h, p.address)}:{p.port}{path}")
    return out


def instance_services(plan: ClusterPlan) -> list[tuple[HostPlan, Service]]:
    """The services that register one `generate` instance each: rank 0 of every planned worker."""
    out = []
    for w in plan.workers:
        hname, sname = w.services[0].split("/", 1)
        h = plan.host(hname)
        out.append((h, h.service(sname)))
    return out


def worker_pools(plan: ClusterPlan) -> dict[str, str]:
    """{"host/service": "prefill" | "decode"} of every planned worker of a disaggregated plan (m3_disagg); {}."""
    pools = {f"{h.name}/{s.name}": pool_of(s) for h, s in instance_services(plan)}
    return pools if any(pools.values()) else {}


def system_port(h: HostPlan, s: Service) -> int | None:
    p = s.port("system")
    return p.port if p else None


def metrics_url(h: HostPlan, s: Service) -> str:
    p = s.port("system")
    return f"http://{_url_host(h, p.address)}:{p.port}/metrics" if p else ""


