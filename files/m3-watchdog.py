#!/usr/bin/python3
"""Restart a systemd unit whose HTTP health URL stops answering while the unit is active.

Usage: m3-watchdog.py UNIT URL GRACE_S

Dynamo 1.6.1's frontend, after losing its etcd lease (etcd away for ~30 s), logs `Runtime shutdown initiated`,
closes its HTTP port and can then hang without exiting, so Restart=always never fires (issue 12,
docs/OPERATIONS.md). This restarts it once URL has failed for GRACE_S seconds in a row while the unit is active.
"""
import subprocess
import sys
import time
import urllib.request

INTERVAL_S = 2.0


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return resp.status == 200
    except Exception:  # noqa: BLE001 - any failure to answer counts
        return False


def main() -> None:
    unit, url, grace = sys.argv[1], sys.argv[2], float(sys.argv[3])
    bad_since = None
    while True:
        active = subprocess.run(["systemctl", "is-active", "--quiet", unit]).returncode == 0
        if not active or healthy(url):
            bad_since = None
        elif bad_since is None:
            bad_since = time.monotonic()
        elif time.monotonic() - bad_since >= grace:
            print(f"{unit}: {url} has not answered for {grace:.0f} s while the unit is active: restarting it",
                  flush=True)
            subprocess.run(["systemctl", "restart", unit])
            bad_since = None
        time.sleep(INTERVAL_S)


if __name__ == "__main__":
    main()
