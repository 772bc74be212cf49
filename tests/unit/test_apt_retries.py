"""apt's retry setting (files/m3-apt.conf, which the deploy puts on every host before its first apt operation, and
the testbed hosts' own apt.conf) against the real `apt-get update` of this machine (Debian 12, apt 2.6.1) and a
repository served here on loopback.

The contract (apt-pkg/acquire-worker.cc `HandleFailure` and acquire.cc `Queue::Enqueue`/`Run` in apt 2.6.1; fixed
by apt commit 5378c38d "Fix stuck acquire queues on partial server errors", in apt 3.0.3 and 3.1.3, Launchpad
#2003851): a transient error (503) on one file is retried after a delay (`Acquire::Retries::Delay`, default true);
a file of the same server queued while that retry waits goes in front of it, nothing cycles the queue again, and
`apt-get update` waits forever. Seen on the testbed (2026-12-01): 1 in about 10 `apt-get update`s on 3 fresh hosts
hung when apt-cacher-ng answered one InRelease 503, and a CI run lost its fan-out deploy to it (600 s timeout).
With `Acquire::Retries::Delay "false"` the retry is sent at once and the update finishes.

Needs apt-get (Debian's apt; this machine and CI have it). If the first test fails because the hang is gone, the
machine's apt has the fix (>= 3.0.3) and the contract changed: re-check files/m3-apt.conf against it.
"""
from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import threading

import pytest

from m3deploy.deploy.hostfiles import apt_conf
from m3deploy.testbed import config as tbconfig

EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
RELEASE = ("Suite: {s}\nCodename: {s}\nDate: Tue, 01 Dec 2026 00:00:00 UTC\nArchitectures: amd64\n"
           f"Components: main\nSHA256:\n {EMPTY_SHA256} 0 main/binary-amd64/Packages\n")
HANG_S = 8  # without the setting apt never finishes; with it, well under a second here


@pytest.fixture
def repo(tmp_path):
    """Two suites on one server (as Debian's bookworm and bookworm-updates on one mirror or proxy), unsigned
    (`[trusted=yes]`, no InRelease: apt falls back to Release). Suite a's InRelease answers 503 once."""
    fails = {"/dists/a/InRelease": 1}
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            seen.append(self.path)
            if fails.get(self.path, 0) > 0:
                fails[self.path] -= 1
                code, body = 503, b"busy"
            elif self.path.endswith("/Release"):
                code, body = 200, RELEASE.format(s=self.path.split("/")[2]).encode()
            elif self.path.endswith("/main/binary-amd64/Packages"):
                code, body = 200, b""
            else:
                code, body = 404, b"not here"
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    (tmp_path / "sources.list").write_text(
        "".join(f"deb [trusted=yes] http://127.0.0.1:{port}/ {s} main\n" for s in ("a", "b")))
    for d in ("lists/partial", "cache/archives/partial"):
        (tmp_path / d).mkdir(parents=True)
    yield tmp_path, seen
    srv.shutdown()


def apt_update(d, conf_text: str | None) -> subprocess.CompletedProcess | None:
    """`apt-get update` of the loopback repo only (the machine's sources, lists and apt.conf.d untouched), with
    conf_text as its config file (APT_CONFIG); None when it does not finish within HANG_S."""
    if not shutil.which("apt-get"):
        pytest.fail("apt-get missing: these tests drive Debian's apt (scripts/install-deps.sh runs on Debian 12)")
    env = {k: v for k, v in os.environ.items() if k != "APT_CONFIG"}
    if conf_text is not None:
        (d / "apt.conf").write_text(conf_text)
        env["APT_CONFIG"] = str(d / "apt.conf")
    cmd = ["apt-get", "update", "-o", f"Dir::Etc::sourcelist={d}/sources.list", "-o", "Dir::Etc::sourceparts=-",
           "-o", "Dir::Etc::parts=/nonexistent", "-o", f"Dir::State::Lists={d}/lists", "-o", f"Dir::Cache={d}/cache",
           "-o", "Debug::NoLocking=1", "-o", "APT::Sandbox::User=root", "-o", "Acquire::Languages=none",
           "-o", "Acquire::http::Proxy=DIRECT"]  # the testbed's file names its bridge's proxy
    try:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=HANG_S)
    except subprocess.TimeoutExpired:
        return None


def test_without_the_setting_this_apt_waits_forever_on_one_503(repo):
    d, seen = repo
    assert apt_update(d, None) is None, ("apt-get update finished: this apt no longer has the stuck-queue bug "
                                         "(fixed in apt 3.0.3); re-check files/m3-apt.conf")
    # suite b's InRelease answered 404, so its Release was queued, in front of a's delayed retry; never sent
    assert "/dists/b/InRelease" in seen and "/dists/b/Release" not in seen, seen


@pytest.mark.parametrize("conf", ["deploy", "testbed"])
def test_with_the_setting_apt_retries_at_once_and_finishes(repo, conf):
    d, seen = repo
    text = apt_conf().text if conf == "deploy" else tbconfig.render_apt_proxy_conf("10.77.0.1")
    res = apt_update(d, text)
    assert res is not None, f"apt-get update with the {conf} apt.conf still hung on one 503; requests: {seen}"
    assert res.returncode == 0, res.stdout + res.stderr
    assert seen.count("/dists/a/InRelease") == 2, seen  # the 503, then its retry
    lists = sorted(p.name for p in (d / "lists").iterdir())
    for s in ("a", "b"):  # both suites' indexes are in the lists now (their empty Packages apt does not fetch)
        assert any(n.endswith(f"_dists_{s}_Release") for n in lists), lists
