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
- keys that read as ours (`M3_INTERFACE`, `m3-parallel`, a Cyrillic `м3_parallel`): refused with the key meant.
- addresses compared in canonical form (`fd00:20::11` is `fd00:20:0:0:0:0:0:11`, `::ffff:10.0.0.1` is
  `10.0.0.1`); never a zone or an IPv6 link-local address (etcd's bind check, `checkBindURLs`, takes
  `net.ParseIP`, which refuses `fe80::10%eth0`; without a zone Linux cannot bind fe80::/10).
- `m3_model_id`: a Hugging Face repo id (huggingface_hub `validate_repo_id`, namespaced: what the weights role
  stages); no local path (the plan mounts only m3_hf_cache and stages only repos), no URL.
- `m3_image`: docker's reference grammar (distribution/reference regexp.go, normalize.go).
- engine flags the plan owns (engines.yaml: parallelism, ports, host, model, served name) never in
  m3_extra_args / m3_unset_args: the key that sets each is named instead.
- sizes: an env line fits docker's --env-file reader (64 KiB a line), an argument the kernel's MAX_ARG_STRLEN.
"""
from __future__ import annotations

import difflib
import ipaddress
import itertools
import posixpath
import re
import unicodedata
from collections import defaultdict
from typing import Any, Iterable

from m3deploy.core import catalog, fanout
from m3deploy.core.connection import global_arg_problem, hosts_phrase, ssh_key_problem
from m3deploy.core.errors import M3Error
from m3deploy.core.refs import image_problem, model_id_problem
from m3deploy.core.settings import KEYS, RENAMED, get

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
    """An address as the host part of a URL or host:port (RFC 3986: an IPv6 literal in brackets). A zone
    (`fe80::10%eth0`) is refused: no URL m3 renders could carry it (see `address_problem`)."""
    if "%" in address:
        raise M3Error(f"refusing to put {address!r} in a URL: it has a zone. {FIX_ZONE}")
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


_URL_AUTHORITY = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://(?:[^@/\s\"',]*@)?([^/\s\"',?#]*)")


def unbracketed_urls(values: Iterable[str]) -> list[str]:
    """The `scheme://host:port` authorities in `values` (JSON inside too) whose host is an IPv6 literal without
    brackets: RFC 3986 3.2.2 brackets it, and every parser (Go's net/url, ZMQ's tcp://, Rust's url) splits the
    port off at the last `:` of an unbracketed one."""
    return [m.group(1) for v in values if "://" in str(v) for m in _URL_AUTHORITY.finditer(str(v))
            if m.group(1).count(":") > 1 and not m.group(1).startswith("[")]


def _url_problem(values) -> str:
    bad = unbracketed_urls(values)
    if not bad:
        return ""
    fixed = ", ".join(re.sub(r"^(.*):([0-9]+)$", r"[\1]:\2", b) for b in bad)
    return (f"the URL host {_names(bad)} is an IPv6 address without brackets: every URL parser reads the part after "
            f"its last ':' as the port (RFC 3986 3.2.2). Fix: {fixed}")


FIX_ZONE = ("etcd refuses a zone in --listen-client-urls/--listen-peer-urls (server/embed/config.go checkBindURLs "
            "takes Go's net.ParseIP, which rejects `fe80::10%eth0`), and without one Linux cannot bind an fe80::/10 "
            "address. Fix: the host's global or unique-local (fd00::/8) address on its cluster interface")


def address_problem(value: str) -> str:
    """Why `value` cannot be a cluster address ('' when it can): an IP literal etcd can bind, not 0.0.0.0/::."""
    if not is_ip(value):
        return (f"{value!r} is not an IP address; etcd's --listen-client-urls and --listen-peer-urls need IPs "
                "(a DNS name stops etcd at start). Fix: the host's cluster IP, e.g. '10.0.0.11' or 'fd00::11'")
    ip = ipaddress.ip_address(value)
    if "%" in value or (ip.version == 6 and ip.is_link_local):
        return f"{value} is an IPv6 {'address with a zone' if '%' in value else 'link-local address'}: {FIX_ZONE}"
    if ip.is_unspecified:
        return (f"{value} binds every interface (etcd, NATS and the workers would listen on all of them). "
                "Fix: the host's cluster IP")
    return ""


def canonical_address(value: str) -> str:
    """One spelling per address: an IP in its compressed form (an IPv4-mapped IPv6 address as the IPv4 one),
    a DNS name in lower case (DNS names are case-insensitive)."""
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        return value.strip().rstrip(".").lower()
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip.compressed)


# ------------------------------------------------------------------ keys that read as ours
# UTS #39 confusables.txt: letters of other scripts drawn like the ASCII ones a key is made of (skeleton -> ASCII)
CONFUSABLES = str.maketrans({
    "а": "a", "в": "b", "с": "c", "ԁ": "d", "е": "e", "һ": "h", "і": "i", "ј": "j", "к": "k", "м": "m",
    "н": "h", "о": "o", "р": "p", "ԛ": "q", "г": "r", "ѕ": "s", "т": "t", "у": "y", "х": "x", "ԝ": "w",
    "з": "3", "ӡ": "3", "ʒ": "3", "ȝ": "3", "α": "a", "ε": "e", "ι": "i", "κ": "k", "ν": "v", "ο": "o",
    "ρ": "p", "τ": "t", "υ": "u", "χ": "x", "ı": "i", "ℓ": "l", "＿": "_", "‐": "-", "‑": "-", "–": "-",
})


def _skeleton(name: str) -> str:
    s = unicodedata.normalize("NFKD", name.strip())  # fullwidth letters, ligatures; accents split off
    s = "".join(c for c in s if not unicodedata.combining(c)).casefold().translate(CONFUSABLES)
    return re.sub(r"[\s.-]+", "_", s)


def meant_key(name: str) -> str:
    """The m3 key a data key not spelled `m3_...` reads as ('' when it reads as none): `M3_INTERFACE`,
    `m3-parallel`, `м3_parallel` (Cyrillic м). `m3_?` when it reads as an m3 key that does not exist."""
    if name.startswith("m3_"):
        return ""
    s = _skeleton(name)
    if s in KEYS:
        return s
    if not s.startswith("m3"):
        return ""
    near = difflib.get_close_matches("m3_" + s[2:].lstrip("_"), KEYS, n=1, cutoff=0.8)
    return near[0] if near else ("m3_?" if s.startswith("m3_") else "")


def _odd_chars(name: str) -> str:
    odd = [c for c in dict.fromkeys(name) if not c.isascii()]
    return "; ".join(f"{c!r} is U+{ord(c):04X} {unicodedata.name(c, '?')}" for c in odd)


def lookalike_problem(name: str) -> str:
    meant = meant_key(name)
    if not meant:
        return ""
    odd = _odd_chars(name)
    why = f"it holds non-ASCII characters ({odd})" if odd else "m3 keys are lower-case `m3_` names"
    fix = (f"did you mean {meant}? Fix: rename it to {meant}" if meant != "m3_?"
           else "Fix: spell it in lower-case ASCII (docs/INVENTORY.md lists every key)")
    return f"key {name!r} reads as an m3deploy key but is not one ({why}); it would be ignored: {fix}"


# ------------------------------------------------------------------ sizes
ENV_LINE_MAX = 64 * 1024 - 1  # docker/cli opts/file.go reads --env-file with a bufio.Scanner: 64 KiB a line
MAX_ARG_STRLEN = 32 * 4096  # linux/binfmts.h: one argv or envp string, NUL included (execve: E2BIG past it)
UNIT_LINE_MAX = 1024 * 1024  # systemd's LONG_LINE_MAX: a longer unit-file line is refused


def size_problem(value: Any, what: str) -> str:
    if isinstance(value, dict):
        for k, v in value.items():
            n = len(f"{k}={v}".encode())
            if n > ENV_LINE_MAX:
                return (f"{k} is {n} bytes as a NAME=value line: docker's --env-file reader takes at most 64 KiB a "
                        "line (bufio.Scanner, docker/cli opts/file.go) and execve 128 KiB a variable "
                        "(MAX_ARG_STRLEN). Fix: ship the data as a file on the hosts and pass its path")
    elif isinstance(value, (list, tuple)):
        for a in value:
            n = len(str(a).encode())
            if n >= MAX_ARG_STRLEN:
                return (f"an argument of {what} is {n} bytes: execve takes at most {MAX_ARG_STRLEN - 1} bytes a "
                        "string (MAX_ARG_STRLEN, 128 KiB). Fix: ship it as a file on the hosts and pass its path")
    return ""


# ------------------------------------------------------------------ flags the plan owns (engines.yaml)
# engines.yaml placeholders -> the key the plan fills each from (m3deploy.core.build `fill`)
PLACEHOLDER_KEYS = {"model_id": "m3_model_id", "served": "m3_served_model_name", "model_dir": "m3_model_id",
                    "address": "m3_address", "http_port": "m3_worker_port", "nnodes": "m3_parallel",
                    "rank": "m3_parallel", "master": "m3_parallel", "master_url_host": "m3_master_port",
                    "master_port": "m3_master_port"}


def _placeholder_key(value) -> str:
    found = re.findall(r"\{([a-z_]+)\}", str(value))
    return next((PLACEHOLDER_KEYS[f] for f in reversed(found) if f in PLACEHOLDER_KEYS), "m3_parallel")


def owned_flags(engine: str) -> dict[str, str]:
    """{flag: the key that sets it} for every flag the plan sets on this engine (engines.yaml: `parallel`,
    `max_model_len`, `standalone_args`, `served_name_flag`, the `launch` lines' flags, `multi_host`), and the
    engine's own spellings of them (`flag_aliases`)."""
    rules = catalog.engines().get(engine) or {}
    out = {f: "m3_parallel" for f in (rules.get("parallel") or {}).values()}
    if rules.get("max_model_len"):
        out[rules["max_model_len"]] = "m3_max_model_len"
    for flag, value in (rules.get("standalone_args") or {}).items():
        out[flag] = _placeholder_key(value)
    if rules.get("served_name_flag"):
        out[rules["served_name_flag"]] = "m3_served_model_name"
    for line in (rules.get("launch") or {}).values():
        for flag, value in itertools.pairwise(line):
            if str(flag).startswith("--") and "{" in str(value):
                out[flag] = _placeholder_key(value)
    for flags in (rules.get("multi_host") or {}).values():
        for flag, value in flags.items():
            out[flag] = _placeholder_key(value)
    for alias, flag in (rules.get("flag_aliases") or {}).items():
        if flag in out:
            out[alias] = out[flag]
    return out


def owned_flag_problem(engine: str, flags: Iterable, key: str) -> str:
    """The plan-owned flags among `flags` (`--tensor_parallel_size`, `--port=8001` and argparse's unambiguous
    abbreviations included)."""
    owned = owned_flags(engine)
    bad = []
    for f in flags:
        f = str(f).split("=", 1)[0]
        norm = f if not f.startswith("--") else "--" + f[2:].replace("_", "-")
        hit = owned.get(norm) or next((k for o, k in owned.items() if len(norm) > 5 and o.startswith(norm)
                                       and o.startswith("--")), "")
        if hit:
            bad.append((f, hit))
    if not bad:
        return ""
    keys = sorted({k for _, k in bad})
    return (f"{_names(f for f, _ in bad)} {'is' if len(bad) == 1 else 'are'} set by the plan on {engine} from "
            f"{', '.join(keys)}; in {key} {'it' if len(bad) == 1 else 'they'} would contradict the plan (its layout, "
            f"ports, readiness checks and staged weights). Fix: remove {'it' if len(bad) == 1 else 'them'} from {key} "
            f"and set {' / '.join(keys)} instead")


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


def _disagg_problem(value) -> str:
    """m3_disagg: its shape (core.disagg), then each pool's args and env as m3_extra_args / m3_extra_env's."""
    from m3deploy.core import disagg

    why = disagg.shape_problem(value)
    for pool in disagg.POOLS if not why and value else ():
        args, env = value[pool].get("args") or [], value[pool].get("env") or {}
        bad = secret_flags(args)
        why = (f"{pool}.args: {_names(bad)} carries a secret (value not shown). {SECRET_FIX}" if bad else "") or (
            f"{pool}.env: " + _env_problem(env) if _env_problem(env) else "")
        if why:
            break
    return why


# checks that are one pattern: (the pattern the whole value must match, what is wrong when it does not)
FORMATS = {
    "name": (CLUSTER_NAME, "{value!r}: a cluster name is letters, digits, . _ - (it names units and the controller's "
                           "store)"),
    "ifname": (IFNAME, "{value!r} is not a network interface name (1-15 of letters, digits, . _ - : @)"),
    "version": (VERSION, "{value!r} is not a version (e.g. 1.6.1)"),
    "branch": (re.compile(r"[0-9]+"), "{value!r} is not a driver branch. Fix: a number such as 580"),
    "url": (URL, "{value!r} is not an http(s) URL (no spaces or shell characters)"),
    "duration": (re.compile(r"([0-9]+(ms|s|m|h|d|w|y))+"),
                 "{value!r} is not a Prometheus duration. Fix: a number and a unit, e.g. '15d' or '12h'"),
    "bytesize": (re.compile(r"[0-9]+(B|KB|MB|GB|TB|PB|EB)"),
                 "{value!r} is not a Prometheus size. Fix: a number and a unit, e.g. '10GB' or '512MB'"),
}


def _semantic(key, value) -> str:
    """The key's `check` beyond its type: '' when fine."""
    check = key.check
    if check in FORMATS:
        rx, why = FORMATS[check]
        return "" if rx.fullmatch(str(value)) else why.format(value=value)
    if check == "port":
        lo, hi = PORT_RANGE
        if not lo <= value <= hi:
            why = ("is below 1024: the services run as the unprivileged user m3" if 0 < value < lo
                   else "is not a TCP port")
            return f"{value} {why}. Fix: a port in {lo}-{hi} (not 22)"
    elif check == "ip":
        return address_problem(value)
    elif check == "image":
        return image_problem(value)
    elif check == "repo_id":
        return model_id_problem(value)
    elif check == "path:teardown":
        return teardown_path_problem(value)
    elif check == "path":
        if not value.startswith("/"):
            return f"{value!r} is not an absolute path. Fix: a host path such as /opt/m3/bin/hf"
    elif check == "env":
        return _env_problem(value) or _url_problem(value.values()) or size_problem(value, key.name)
    elif check == "args":
        bad = secret_flags(value)
        if bad:
            return f"{_names(bad)} carries a secret (value not shown). {SECRET_FIX}"
        tokens = [*value, *map(str, value.values())] if isinstance(value, dict) else value
        return _url_problem(tokens) or size_problem(tokens, key.name)
    elif check == "disagg":
        return _disagg_problem(value)
    elif check == "planner":
        from m3deploy.core import planner_settings

        return planner_settings.shape_problem(value)
    elif check == "names":
        bad = [v for v in value if not isinstance(v, str) or not v]
        if bad:
            return f"{bad!r}: expected a list of non-empty strings"
    elif check == "ints":
        bad = [v for v in value if not isinstance(v, int) or isinstance(v, bool) or v < 1]
        if bad:
            return f"{bad!r}: expected a list of positive whole numbers, e.g. [1, 2, 4]"
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
    if _skeleton(name) in KEYS:  # m3_Parallel, m3_раrallel
        odd = _odd_chars(name)
        return f"did you mean {_skeleton(name)}?" + (f" It holds non-ASCII characters ({odd})" if odd else "")
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
            if lookalike_problem(k):
                add(h, lookalike_problem(k), k)
            elif k.startswith("m3_"):
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
            elif k.startswith("ssh_") and ssh_key_problem(k):
                add(h, ssh_key_problem(k), k)
            elif k.startswith("_") and global_arg_problem(k):
                add(h, global_arg_problem(k), k)
        for k in ("m3_extra_args", "m3_unset_args"):
            v = h.data.get(k)
            if v and not value_problem(k, v) and not (k == "m3_extra_args" and _unparsable(v)):
                flags = v if isinstance(v, dict) else [a for a in v if str(a).startswith("-")]
                why = owned_flag_problem(str(get(h.data, "m3_engine")), flags, k)
                if why:
                    add(h, f"key {k}: {why}", k)
        port = h.data.get("ssh_port")
        if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535):
            add(h, f"key ssh_port: {port!r} is not a TCP port (1-65535)", "ssh_port")
    _unique(hosts, add)
    return [f"{_hosts(names)}{where}: {msg}" for (where, msg), names in found.items()]


def _unparsable(args) -> bool:
    from m3deploy.core.recipes import (
        parse_arg_list,  # recipes reads the layers: imported only when needed
    )

    try:
        parse_arg_list(args)
        return False
    except M3Error:
        return True


def address_of(h) -> str:
    """The host's cluster address: m3_address, else ssh_hostname, else its name (as the plan reads it)."""
    return str(h.data.get("m3_address") or h.data.get("ssh_hostname") or h.name)


def _unique(hosts, add) -> None:
    by_addr, by_ssh = defaultdict(list), defaultdict(list)
    for h in hosts:
        a = address_of(h)
        why = "" if h.data.get("m3_address") or control_chars(a) else address_problem(a)
        if why:
            add(h, f"key m3_address is not set and its default (ssh_hostname or name) is not a cluster address: "
                   f"{why.replace('Fix: ', 'Fix: set m3_address to ')}", "ssh_hostname")
        by_addr[canonical_address(a)].append(h)
        if h.data.get("ssh_hostname"):
            by_ssh[canonical_address(str(h.data["ssh_hostname"]))].append(h)
    for what, key, groups in (("cluster address", "m3_address", by_addr), ("ssh_hostname", "ssh_hostname", by_ssh)):
        for a, hs in groups.items():
            if len(hs) > 1:
                spelled = {x.name: str(x.data.get(key) or address_of(x)) for x in hs}
                also = "" if len(set(spelled.values())) == 1 else " (" + ", ".join(
                    f"{n}: {v}" for n, v in spelled.items()) + ": one address spelled differently)"
                add(hs[0], f"has the same {what} {a} as {_hosts(x.name for x in hs[1:])}{also}"
                           + (": both would be one machine" if key == "ssh_hostname" else "")
                           + f". Fix: give each host its own {key}", key)


_hosts = hosts_phrase


# ------------------------------------------------------------------ ports the plan derives
PORT_KEYS = {"system": "m3_system_port", "kv-events": "m3_kv_events_port"}  # http: frontend's or workers' key


def derived_port_problems(plan, hosts) -> list[str]:
    """Every port of the built plan within 1024-65535, the derived ones too (a key's port + 1 per further
    service on a host): each out-of-range one names the key it came from and its largest value that fits."""
    lo, hi = PORT_RANGE
    data = {h.name: h for h in hosts}
    out = []
    for hp in plan.hosts:
        over: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for svc in hp.services:
            for p in svc.ports:
                key = PORT_KEYS.get(p.name) or (
                    ("m3_frontend_port" if svc.kind == "frontend" else "m3_worker_port") if p.name == "http" else "")
                if key and not lo <= p.port <= hi:
                    over[key].append((svc.name, p.port))
        for key, found in over.items():
            h = data.get(hp.name)
            base = int(get(h.data, key)) if h else lo
            src = (getattr(h, "sources", {}) or {}).get(key, "") if h else ""
            top = max(port for _, port in found)
            out.append(f"host {hp.name}{f' ({src})' if src else ''}: key {key} = {base}: the plan derives "
                       + ", ".join(f"port {port} for {name}" for name, port in found)
                       + f" ({key} + 1 per further service on the host), past {hi}. Fix: {key} <= "
                       f"{base - (top - hi)}")
    return out
