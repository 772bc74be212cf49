"""The input contract: every value a user can type, checked against its key's schema (m3deploy.core.settings)
before anything else reads it. All problems at once, each naming the host(s), the key, the file it was set in
and the fix.

What reaches a host is refused here when it could change the meaning of the file or command it lands in:
- `\\n`, `\\r` and NUL in any host name, group name or `m3_*`/`ssh_*` value: systemd 252 (systemd.syntax(7))
  ends a unit or env-file line at `\\n` and at `\\r`; its env-file parser and C strings end at NUL; an
  ssh_config line ends at `\\n` (a newline in ssh_hostname would add a `ProxyCommand`).
- addresses: IP literals only (etcd's --listen-client-urls / --listen-peer-urls take IPs, not names; etcd
  refuses a name at start, long after drivers and weights are in place), never 0.0.0.0 or ::, one per host.
- ports: 1024-65535 (m3's services run as the unprivileged user m3, which cannot bind below 1024), never 22.
- paths teardown deletes (`check="path:teardown"`): confined to a directory m3 owns.
"""
from __future__ import annotations

import difflib
import ipaddress
import posixpath
import re
from collections import defaultdict
from typing import Any, Iterable

from m3deploy.core import fanout
from m3deploy.core.settings import KEYS, RENAMED

CONTROL = {"\n": "a newline", "\r": "a carriage return", "\0": "a NUL byte"}
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:-]*")
CLUSTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
IFNAME = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")
VERSION = re.compile(r"[0-9][0-9A-Za-z.+-]*")
URL = re.compile(r"https?://[A-Za-z0-9._~:/?#@%+=,-]+")
USER = re.compile(r"[a-z_][a-z0-9_-]*")
PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+:~-]+)?")
# directories a path key may never be, nor lie inside of (teardown would delete them, or the deploy write there)
SYSTEM_DIRS = ("/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/media",
               "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/usr/local",
               "/var", "/var/lib", "/var/cache", "/var/log", "/var/tmp", "/data", "/scratch")
NEVER_INSIDE = ("/bin", "/boot", "/dev", "/etc", "/lib", "/proc", "/run", "/sbin", "/sys", "/usr")
M3_COMPONENT = re.compile(r"(^|.*[-_.])m3($|[-_.].*)")
PORT_RANGE = (1024, 65535)
FIX_PATH = ("Fix: use a directory m3 owns, e.g. /opt/m3, /var/lib/m3/hf, or one whose name has an `m3` part "
            "(/data/m3-hf): teardown (m3_state=absent) deletes it")


def control_chars(value: Any) -> str:
    """What control character `value` (a string, or any string in a list/dict) holds: '' when none."""
    if isinstance(value, str):
        return next((what for c, what in CONTROL.items() if c in value), "")
    if isinstance(value, dict):
        return next((w for w in map(control_chars, [*value.keys(), *value.values()]) if w), "")
    if isinstance(value, (list, tuple, set)):
        return next((w for w in map(control_chars, value) if w), "")
    return ""


def is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        return False


def url_host(address: str) -> str:
    """An address as the host part of a URL or host:port (RFC 3986: an IPv6 literal in brackets)."""
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def teardown_path_problem(path: Any) -> str:
    """Why teardown must not `rm -rf` this path ('' when it is confined to a directory m3 owns)."""
    if not isinstance(path, str) or not path.startswith("/"):
        return f"{path!r} is not an absolute path. {FIX_PATH}"
    if posixpath.normpath(path) != path or "//" in path:
        return f"{path!r} is not a normalized path (no trailing /, //, . or ..). Fix: {posixpath.normpath(path)!r}"
    if path in SYSTEM_DIRS or any(path.startswith(d + "/") for d in NEVER_INSIDE):
        return f"{path} is a system directory. {FIX_PATH}"
    parts = path.strip("/").split("/")
    if parts[0] == "home" and len(parts) <= 2:
        return f"{path} is a home directory. {FIX_PATH}"
    if not any(M3_COMPONENT.match(p) for p in parts):
        return f"{path} is not a directory m3 owns. {FIX_PATH}"
    return ""


def _env_problem(value) -> str:
    """An {NAME: value} env map's problem ('' when fine): names, value types, no secret names."""
    bad = [k for k in value if not isinstance(k, str) or not ENV_NAME.fullmatch(k)]
    if bad:
        return f"{_names(bad)} not valid environment variable name(s). Fix: letters, digits, _ (not first digit)"
    bad = [k for k, v in value.items() if not isinstance(v, (str, int, float)) or isinstance(v, bool)]
    if bad:
        return f"the value of {_names(bad)} is not a string or number. Fix: quote it, e.g. \"1\""
    bad = secret_env_names(value)
    if bad:
        return f"{_names(bad)} look(s) like a secret (value not shown). {SECRET_FIX}"
    return ""


def _semantic(key, value) -> str:
    """The key's `check` beyond its type: '' when fine."""
    check = key.check
    if check == "port":
        lo, hi = PORT_RANGE
        if not lo <= value <= hi:
            why = ("is below 1024: the services run as the unprivileged user m3" if 0 < value < lo
                   else "is not a TCP port")
            return f"{value} {why}. Fix: a port in {lo}-{hi} (not 22)"
    elif check == "ip":
        if not is_ip(value):
            return (f"{value!r} is not an IP address; etcd's --listen-client-urls and --listen-peer-urls need IPs "
                    "(a DNS name stops etcd at start). Fix: the host's cluster IP, e.g. '10.0.0.11' or 'fd00::11'")
        if ipaddress.ip_address(value).is_unspecified:
            return (f"{value} binds every interface (etcd, NATS and the workers would listen on all of them). "
                    "Fix: the host's cluster IP")
    elif check == "path:teardown":
        return teardown_path_problem(value)
    elif check == "path":
        if not value.startswith("/"):
            return f"{value!r} is not an absolute path. Fix: a host path such as /opt/m3/bin/hf"
    elif check == "env":
        return _env_problem(value)
    elif check == "args":
        bad = secret_flags(value)
        if bad:
            return f"{_names(bad)} carries a secret (value not shown). {SECRET_FIX}"
    elif check == "names":
        bad = [v for v in value if not isinstance(v, str) or not v]
        if bad:
            return f"{bad!r}: expected a list of non-empty strings"
    elif check == "ints":
        bad = [v for v in value if not isinstance(v, int) or isinstance(v, bool) or v < 1]
        if bad:
            return f"{bad!r}: expected a list of positive whole numbers, e.g. [1, 2, 4]"
    elif check == "name" and not CLUSTER_NAME.fullmatch(value):
        return f"{value!r}: a cluster name is letters, digits, . _ - (it names units and the controller's store)"
    elif check == "ifname" and not IFNAME.fullmatch(value):
        return f"{value!r} is not a network interface name (1-15 of letters, digits, . _ - : @)"
    elif check == "version" and not VERSION.fullmatch(value):
        return f"{value!r} is not a version (e.g. 1.6.1)"
    elif check == "branch" and not re.fullmatch(r"[0-9]+", str(value)):
        return f"{value!r} is not a driver branch. Fix: a number such as 580"
    elif check == "url" and not URL.fullmatch(value):
        return f"{value!r} is not an http(s) URL (no spaces or shell characters)"
    elif check == "weights_source":
        try:
            fanout.parse_source(value)
        except ValueError as e:
            return str(e)
    elif check in ("users", "packages"):
        rx = USER if check == "users" else PACKAGE
        bad = [v for v in value if not isinstance(v, str) or not rx.fullmatch(v)]
        if bad:
            return f"{_names(bad)}: not {'a user' if check == 'users' else 'an apt package'} name"
    return ""


# Secrets never ride in m3_extra_env / m3_extra_args: those land in a 0644 unit file, `ps`, the plan and logs.
SECRET_WORDS = {"TOKEN", "KEY", "APIKEY", "PASSWORD", "PASSWD", "SECRET"}  # a `_`-separated word of an env name
SECRET_FLAG = re.compile(r"--(?:[a-z0-9-]*-)?(?:api-key|token|password|passwd|secret)")  # --api-key, --hf-token
SECRET_FIX = ("Fix: remove it; an HF token goes in a 0600 file on the controller named by m3_hf_token_file (the "
              "deploy carries it in a 0600 env file, never argv), an API key for the endpoint in one named by "
              "m3_api_key_file")


def secret_env_names(env) -> list[str]:
    return [k for k in env if isinstance(k, str) and SECRET_WORDS & set(k.upper().split("_"))]


def secret_flags(args) -> list[str]:
    """Flags of an m3_extra_args list or dict that carry a secret (`--api-key V`, `--api-key=V`), values unread."""
    flags = args if isinstance(args, dict) else [a for a in args if isinstance(a, str) and a.startswith("--")]
    return [f.split("=", 1)[0] for f in flags
            if SECRET_FLAG.fullmatch(str(f).split("=", 1)[0].lower().replace("_", "-"))]


def _names(values) -> str:
    return ", ".join(repr(v) for v in values)


def value_problem(name: str, value: Any) -> str:
    """Why `value` is not valid for the m3_* key `name` ('' when it is). Unknown keys are not checked here."""
    key = KEYS[name]
    what = control_chars(value)
    if what:
        return (f"{value!r} holds {what}; systemd ends a unit or env-file line at \\n and \\r and an env file "
                "stops at NUL. Fix: remove it (a trailing newline from `cat`, or a CRLF CSV)")
    if isinstance(value, str) and list in (key.type if isinstance(key.type, tuple) else (key.type,)):
        if key.check == "ints":
            return f"must be a list, not the string {value!r}. Fix: {name} = [1, 2, 4]"
        return f"must be a list, not the string {value!r}. Fix: {name} = [{value!r}]"
    value, why = key.parse(value)
    if why or value is None:
        return why
    return _semantic(key, value)


def did_you_mean(name: str) -> str:
    if name in RENAMED:
        return f"it was replaced: did you mean {RENAMED[name]}?"
    near = difflib.get_close_matches(name, KEYS, n=1, cutoff=0.7)
    return f"did you mean {near[0]}?" if near else "see docs/INVENTORY.md for every key"


def check_hosts(hosts: Iterable) -> list[str]:
    """Every input problem of these InvHosts (m3deploy.core.inventory), identical ones merged across hosts."""
    found: dict[tuple[str, str], list[str]] = defaultdict(list)  # (where, message) -> host names

    def add(host, message, key=""):
        src = (getattr(host, "sources", {}) or {}).get(key, "")
        found[(f" ({src})" if src else "", message)].append(host.name)

    hosts = list(hosts)
    for h in hosts:
        what = control_chars(h.name)
        if what or not HOST_NAME.fullmatch(h.name):
            add(h, f"the host name {h.name!r} holds {what or 'a character a unit or ssh_config cannot carry'}. "
                   "Fix: letters, digits, . _ - @ : only")
        for g in h.groups:
            if control_chars(g):
                add(h, f"the group name {g!r} holds {control_chars(g)}. Fix: rename the group")
        for k, v in h.data.items():
            if not isinstance(k, str):
                continue
            if k.startswith("m3_"):
                if k not in KEYS:
                    add(h, f"key {k} is not an m3deploy key ({did_you_mean(k)}); it would be ignored. "
                           "Fix: correct or remove it", k)
                    continue
                why = value_problem(k, v)
                if why:
                    add(h, f"key {k}: {why}", k)
            elif k.startswith("ssh_") and control_chars(v):
                add(h, f"key {k}: {v!r} holds {control_chars(v)}; it would add lines to verify's ssh_config "
                       "(e.g. a ProxyCommand run on the controller). Fix: remove it", k)
        port = h.data.get("ssh_port")
        if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535):
            add(h, f"key ssh_port: {port!r} is not a TCP port (1-65535)", "ssh_port")
    _unique(hosts, add)
    return [f"{_hosts(names)}{where}: {msg}" for (where, msg), names in found.items()]


def address_of(h) -> str:
    """The host's cluster address: m3_address, else ssh_hostname, else its name (as the plan reads it)."""
    return str(h.data.get("m3_address") or h.data.get("ssh_hostname") or h.name)


def _unique(hosts, add) -> None:
    by_addr, by_ssh = defaultdict(list), defaultdict(list)
    for h in hosts:
        a = address_of(h)
        if not h.data.get("m3_address") and not control_chars(a) and not is_ip(a):
            add(h, f"key m3_address is not set and its default (ssh_hostname or name) {a!r} is not an IP address; "
                   "etcd and the workers bind the cluster address, and etcd needs an IP. Fix: set m3_address = "
                   "'<the host's cluster IP>'")
        by_addr[a].append(h)
        if h.data.get("ssh_hostname"):
            by_ssh[str(h.data["ssh_hostname"])].append(h)
    for a, hs in by_addr.items():
        if len(hs) > 1:
            add(hs[0], f"has the same cluster address {a} as {_hosts(x.name for x in hs[1:])}. Fix: give each "
                       "host its own m3_address")
    for a, hs in by_ssh.items():
        if len(hs) > 1:
            add(hs[0], f"has the same ssh_hostname {a} as {_hosts(x.name for x in hs[1:])}: both would be one "
                       "machine. Fix: give each host its own ssh_hostname")


def _hosts(names) -> str:
    names = list(dict.fromkeys(names))
    more = f" (+{len(names) - 8} more)" if len(names) > 8 else ""
    return ("host " if len(names) == 1 else "hosts ") + ", ".join(names[:8]) + more
