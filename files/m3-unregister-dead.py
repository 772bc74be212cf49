#!/usr/bin/python3
"""Unregister the Dynamo processes of this host that died without unregistering (a worker unit's ExecStopPost).

Usage: m3-unregister-dead.py ENV_FILE [systemd|docker]

ENV_FILE is the unit's own 0600 env file (KEY=value lines, in systemd's EnvironmentFile quoting or docker's literal
--env-file dialect, m3deploy.deploy.render.env_line), read here so that no secret is in argv: ETCD_ENDPOINTS
(comma-separated), ETCD_AUTH_USERNAME / ETCD_AUTH_PASSWORD (when etcd has auth), DYN_TCP_RPC_HOST (this host's
address in the records).

Why: a Dynamo 1.6.1 process registers each endpoint under `v1/instances/...` in etcd, attached to its primary lease
(granted TTL 30 s); the record's `transport.tcp` is the `HOST:PORT/...` the frontend sends requests to. A process
that stops gracefully deletes its records first. A killed one (SIGKILL, OOM, a crash) leaves them until its lease
expires, up to 30 s, and the frontend keeps routing to them: each attempt fails at once (connection refused) and the
frontend migrates the request, but only `--migration-limit` times. On the testbed, after a crash loop left 5 such
records, a request that met 4 of them in a row was answered 503 (the frontend's journal, 2026-12-02: "migration
retries exhausted", "no backend worker available"; docs/CONTRACTS.md "A killed worker's records").

A record is dead when its address is this host's and no socket of this host listens on its port (/proc/net/tcp and
tcp6, LISTEN): a process binds its TCP server before it can write the port into a record, and one stopping gracefully
removes its records before it closes the port. Its lease is revoked, which deletes every key of that process
(instance records, model card, event channels): the frontend's watch drops it at once. Live records, and records of
other hosts, are never touched.

Best effort, bounded (3 s per etcd call): it prints what it did and always exits 0; the unit still restarts the
worker when it cannot reach etcd (the records then expire with their lease, as without it). Uses etcd's v3 JSON
gateway (etcd 3.4, as files/m3-etcd-auth.py), no etcdctl.
"""
import base64
import json
import sys
import urllib.error
import urllib.request

PREFIX = "v1/instances/"
TIMEOUT_S = 3


def read_env(path, dialect="systemd"):
    env = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                k, v = line.split("=", 1)
                env[k] = v if dialect == "docker" else unquote(v)
    return env


def unquote(v):
    """A value as m3deploy.deploy.render.env_line wrote it: literal, or in double quotes with \\ escapes."""
    if len(v) < 2 or v[0] != '"' or v[-1] != '"':
        return v
    out, esc = [], False
    for c in v[1:-1]:
        if esc or c != "\\":
            out.append(c)
        esc = not esc and c == "\\"
    return "".join(out)


def listening_ports():
    ports = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 3 and cols[3] == "0A":  # TCP_LISTEN
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def b64(s):
    return base64.b64encode(s.encode()).decode()


def tls_context(env):
    """With m3_internal_tls the env file names the CA and this process's client certificate and key
    (M3_ETCD_CA_FILE / M3_ETCD_CERT_FILE / M3_ETCD_KEY_FILE): etcd's client port refuses a client without one."""
    import ssl

    if not env.get("M3_ETCD_CA_FILE"):
        return None
    ctx = ssl.create_default_context(cafile=env["M3_ETCD_CA_FILE"])
    ctx.load_cert_chain(env["M3_ETCD_CERT_FILE"], env["M3_ETCD_KEY_FILE"])
    return ctx


class Etcd:
    def __init__(self, url, user, password, context=None):
        self.url, self.token, self.context = url.rstrip("/"), None, context
        if user:
            self.token = self.call("auth/authenticate", {"name": user, "password": password})["token"]

    def call(self, path, body):
        req = urllib.request.Request(f"{self.url}/v3/{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        if self.token:
            req.add_header("Authorization", self.token)
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S, context=self.context) as r:
                return json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:  # etcd's own message, never the request (it holds the password)
            raise OSError(f"{path}: HTTP {e.code} {e.read().decode(errors='replace')[:200]}") from None


def dead_records(etcd, host, listening):
    """[(lease, address, key)] of this host's records whose port nobody listens on."""
    end = PREFIX[:-1] + chr(ord(PREFIX[-1]) + 1)
    out = []
    for kv in etcd.call("kv/range", {"key": b64(PREFIX), "range_end": b64(end)}).get("kvs", []):
        try:
            rec = json.loads(base64.b64decode(kv.get("value", "")))
            addr = rec["transport"]["tcp"].split("/", 1)[0]
            h, port = addr.rsplit(":", 1)
            port = int(port)
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # not a TCP endpoint record
        if h.strip("[]") == host.strip("[]") and port not in listening and kv.get("lease", "0") != "0":
            out.append((kv["lease"], addr, base64.b64decode(kv["key"]).decode(errors="replace")))
    return out


def main():
    env = read_env(sys.argv[1], *sys.argv[2:3])
    host = env.get("DYN_TCP_RPC_HOST", "")
    endpoints = [e for e in env.get("ETCD_ENDPOINTS", "").split(",") if e]
    if not host or not endpoints:
        print("m3-unregister-dead: no DYN_TCP_RPC_HOST or ETCD_ENDPOINTS in the env file: nothing to do")
        return
    errors = []
    for url in endpoints:
        try:
            # with m3_internal_tls the login is M3_ETCD_USER / M3_ETCD_PASSWORD (Dynamo logs in by certificate)
            user = env.get("ETCD_AUTH_USERNAME") or env.get("M3_ETCD_USER", "")
            password = env.get("ETCD_AUTH_PASSWORD") or env.get("M3_ETCD_PASSWORD", "")
            etcd = Etcd(url, user, password, tls_context(env))
            dead = dead_records(etcd, host, listening_ports())
            for lease in dict.fromkeys(lease for lease, _, _ in dead):
                etcd.call("lease/revoke", {"ID": lease})
                keys = [f"{k} ({a})" for ls, a, k in dead if ls == lease]
                print(f"m3-unregister-dead: revoked lease {lease} of a process that is gone: {', '.join(keys)}")
            if not dead:
                print(f"m3-unregister-dead: no record of {host} without a listener")
            return
        except (OSError, ValueError, KeyError) as e:
            errors.append(f"{url}: {e}")
    print("m3-unregister-dead: etcd not reachable, the records expire with their lease: " + "; ".join(errors))


if __name__ == "__main__":
    main()
