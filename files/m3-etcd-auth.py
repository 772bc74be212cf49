#!/usr/bin/python3
"""Turn on etcd authentication, idempotently (runs as the etcd unit's ExecStartPost).

Reads from the environment (the unit's 0600 EnvironmentFile, never argv):
  M3_ETCD_URL          client URL of this member, e.g. http://10.77.0.2:2379
  M3_ETCD_ROOT_PASSWORD  password of etcd's `root` user (admin only; Dynamo never gets it)
  M3_ETCD_CA / M3_ETCD_CERT / M3_ETCD_KEY   with m3_internal_tls: the CA and this member's certificate and key
                                            (its client port wants one)
  M3_ETCD_USER / M3_ETCD_PASSWORD   the user Dynamo connects as (Dynamo gets them as
                                    ETCD_AUTH_USERNAME/ETCD_AUTH_PASSWORD;
                                    not ETCD_* here: etcd itself reads ETCD_* variables as its flags)
Creates role `m3` (readwrite on every key), users root + $M3_ETCD_USER, then enables auth.
Re-runs converge (the Dynamo user's password is set to the current secret). Uses the v3 JSON
gateway of etcd 3.4 (no etcdctl needed). Exit 0 = auth on and the Dynamo user can log in.

With auth on (every start after the first), it reads before it writes and writes nothing that is already
right. Every auth write bumps etcd's auth revision, and etcd then refuses every token issued before it
("etcdserver: revision of auth store is old"; etcd server/auth/store.go `ErrAuthOldRevision`); Dynamo 1.6.1 does not
log in again on that error, so a frontend that had logged in between etcd's start and this script listed no
worker until it was restarted by hand (seen after a 30 s etcd outage on the testbed, 2026-12-01).
"""
import base64
import json
import os
import sys
import time
import urllib.error
import urllib.request

URL = os.environ["M3_ETCD_URL"].rstrip("/")
ROOT_PW = os.environ["M3_ETCD_ROOT_PASSWORD"]
USER = os.environ["M3_ETCD_USER"]
USER_PW = os.environ["M3_ETCD_PASSWORD"]
ALL_KEYS = base64.b64encode(b"\0").decode()  # key "\0" .. range_end "\0" = every key


def _context():
    """With m3_internal_tls (M3_ETCD_CA/CERT/KEY: this member's files): verify etcd, show its certificate."""
    import ssl

    if not os.environ.get("M3_ETCD_CA"):
        return None
    ctx = ssl.create_default_context(cafile=os.environ["M3_ETCD_CA"])
    ctx.load_cert_chain(os.environ["M3_ETCD_CERT"], os.environ["M3_ETCD_KEY"])
    return ctx


CONTEXT = _context()


def call(path, body, token=None):
    req = urllib.request.Request(URL + "/v3/" + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    if token:
        req.add_header("Authorization", token)
    try:
        with urllib.request.urlopen(req, timeout=10, context=CONTEXT) as r:
            return json.loads(r.read() or b"{}"), None
    except urllib.error.HTTPError as e:
        try:
            err = json.loads(e.read()).get("error", "")
        except Exception:  # noqa: BLE001
            err = str(e)
        return None, err


def ok_or_exists(res, what):
    _, err = res
    if err and "already exist" not in err:
        sys.exit(f"m3-etcd-auth: {what} failed: {err}")


def converge(token=None):
    """Role m3 with readwrite on every key, user USER with password USER_PW holding it. token: auth is on, so
    read first and write only what differs (see the module doc); None: auth is off, write everything."""
    perm = {"permType": "READWRITE", "key": ALL_KEYS, "range_end": ALL_KEYS}
    role, _ = call("auth/role/get", {"role": "m3"}, token) if token else (None, None)
    if role is None:
        ok_or_exists(call("auth/role/add", {"name": "m3"}, token), "role add m3")
    if role is None or perm not in role.get("perm", []):
        ok_or_exists(call("auth/role/grant", {"name": "m3", "perm": perm}, token), "grant m3")
    user, _ = call("auth/user/get", {"name": USER}, token) if token else (None, None)
    if user is None:
        ok_or_exists(call("auth/user/add", {"name": USER, "password": USER_PW}, token), f"user add {USER}")
    if user is None or call("auth/authenticate", {"name": USER, "password": USER_PW})[0] is None:
        ok_or_exists(call("auth/user/changepw", {"name": USER, "password": USER_PW}, token), f"password {USER}")
    if user is None or "m3" not in user.get("roles", []):
        ok_or_exists(call("auth/user/grant", {"user": USER, "role": "m3"}, token), f"grant {USER}")


def main():
    for _ in range(60):  # the unit is Type=notify, so etcd answers; retry a little anyway
        res, err = call("auth/authenticate", {"name": "root", "password": ROOT_PW})
        if res is not None or (err and "not enabled" in err) or (err and "authentication failed" in err):
            break
        time.sleep(0.5)
    if res is not None:  # auth already on
        converge(res["token"])
    elif "not enabled" in (err or ""):
        converge()
        ok_or_exists(call("auth/user/add", {"name": "root", "password": ROOT_PW}), "user add root")
        ok_or_exists(call("auth/user/grant", {"user": "root", "role": "root"}), "grant root")
        _, err = call("auth/enable", {})
        if err:
            sys.exit(f"m3-etcd-auth: auth enable failed: {err}")
    else:
        sys.exit(f"m3-etcd-auth: cannot log in as root at {URL}: {err}. The data dir was made with another "
                 "root password: restore the controller's secrets.json or wipe the etcd data dir.")
    res, err = call("auth/authenticate", {"name": USER, "password": USER_PW})
    if res is None:
        sys.exit(f"m3-etcd-auth: {USER} cannot log in: {err}")
    print(f"m3-etcd-auth: auth enabled; user {USER} ok")


if __name__ == "__main__":
    main()
