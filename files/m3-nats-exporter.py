#!/usr/bin/python3
"""NATS exporter for Prometheus, shipped by m3deploy (m3_monitor; docs/OBSERVE.md).

Debian 12 ships no prometheus-nats-exporter, and nats-server 2.9 serves its monitoring only as JSON (/varz),
which Prometheus cannot scrape. On each GET /metrics this reads /varz and answers every numeric top-level field
as `gnatsd_varz_<field>` (prometheus-nats-exporter's names, so its dashboards and alerts apply), plus
`gnatsd_varz_up` (1 when /varz answered). Standard library only; listens only on the address it is given.

    m3-nats-exporter.py --listen ADDRESS:PORT --varz http://ADDRESS:8222/varz
"""
import argparse
import json
import socket
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# cumulative fields of /varz (the rest are gauges)
COUNTERS = {"in_msgs", "out_msgs", "in_bytes", "out_bytes", "slow_consumers", "total_connections"}


def render(varz):
    """Prometheus text exposition of /varz's numeric fields (booleans are not numbers here)."""
    lines = []
    server = str(varz.get("server_id", "")).replace("\\", "").replace('"', "")
    for key in sorted(varz):
        value = varz[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        name = "gnatsd_varz_" + "".join(c if c.isalnum() else "_" for c in key)
        lines.append(f"# TYPE {name} {'counter' if key in COUNTERS else 'gauge'}")
        lines.append(f'{name}{{server_id="{server}"}} {value}')
    return lines


class Handler(BaseHTTPRequestHandler):
    varz_url = ""

    def do_GET(self):
        if self.path.split("?")[0] != "/metrics":
            self.send_error(404)
            return
        try:
            with urllib.request.urlopen(self.varz_url, timeout=5) as r:
                lines = render(json.loads(r.read().decode())) + ["# TYPE gnatsd_varz_up gauge", "gnatsd_varz_up 1"]
        except (OSError, ValueError):
            lines = ["# TYPE gnatsd_varz_up gauge", "gnatsd_varz_up 0"]
        body = ("\n".join(lines) + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # no access log in the journal
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--listen", required=True, help="ADDRESS:PORT ([v6]:PORT)")
    ap.add_argument("--varz", required=True, help="nats-server's /varz URL")
    a = ap.parse_args()
    host, _, port = a.listen.rpartition(":")
    Handler.varz_url = a.varz
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server = type("Server", (ThreadingHTTPServer,), {"address_family": family})
    server((host.strip("[]"), int(port)), Handler).serve_forever()


if __name__ == "__main__":
    main()
