"""End-to-end: the local testbed itself (needs root, systemd-container, debootstrap, apt-cacher-ng).

Brings up 3 hosts once per session under a test-only name and range (m3e2e, 10.78.0.0/24) so it
never touches a user's testbed (m3tb, 10.77.0.0/24), checks what a host must be, then brings the
testbed down and checks that nothing is left. Tests run in file order; the last one is `down`.
"""

import contextlib
import json
import os
import runpy
import shutil
import signal
import subprocess
import sys
import time

import pytest
import tbrun

from m3deploy.testbed.machine import SYSCTL_FILE
from tbssh import apt_diagnostics, ssh_to, state_dir

pytestmark = pytest.mark.e2e

NAME = "m3e2e"
SUBNET = "10.78.0.0/24"
TB = tbrun.Testbed(NAME, SUBNET, 3, cli=True)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STATE_DIR = state_dir(NAME)
PROXY_CACHE = os.path.join(os.environ.get("M3_TESTBED_CACHE") or "/var/cache/m3deploy/testbed", "apt-cache", NAME)  # `down` keeps it
APT_BOUND_S = 120  # 3 fresh hosts, cold proxy: ~10-15 s here (2 cores); issue 8 saw > 300 s
INOTIFY = "/proc/sys/fs/inotify/max_user_instances"
cli = tbrun.testbed_cli  # cli(*args, check=True, timeout=...): `m3deploy testbed ARGS`


def state():
    with open(f"{STATE_DIR}/state.json") as f:
        return json.load(f)


ssh = ssh_to(NAME)


@pytest.fixture(scope="session")
def tb(testbed_up):
    before = {}

    def cold():
        shutil.rmtree(PROXY_CACHE, ignore_errors=True)  # cold proxy: hosts' first apt-get goes through to the mirror
        with open(INOTIFY) as f:
            before["inotify"] = f.read().strip()
        with contextlib.suppress(FileNotFoundError):  # another testbed (another e2e lane) raised it before us
            with open(SYSCTL_FILE) as f:
                before["inotify"] = str(json.load(f)["fs.inotify.max_user_instances"])

    with testbed_up(TB, before_up=cold) as up:
        yield {"up_s": up.seconds, "up_out": up.out, "inotify_before": before["inotify"]}


def test_up_writes_state_keys_and_ssh_config(tb):
    st = state()
    assert [h["name"] for h in st["hosts"]] == ["m3e2e-01", "m3e2e-02", "m3e2e-03"]
    assert [h["address"] for h in st["hosts"]] == ["10.78.0.10", "10.78.0.11", "10.78.0.12"]
    assert st["bridge"] == {"name": "m3e2e-br", "address": "10.78.0.1"}
    assert os.stat(st["ssh"]["private_key"]).st_mode & 0o777 == 0o600
    cfg = open(st["ssh"]["ssh_config"]).read()
    assert "StrictHostKeyChecking yes" in cfg and "ControlPath" in cfg and "HostName 10.78.0.12" in cfg
    known = open(st["ssh"]["known_hosts"]).read().splitlines()
    assert len(known) == 3 and len({line.split()[2] for line in known}) == 3  # one key per host
    assert "booting 3 hosts" in tb["up_out"]


def test_hosts_outlive_the_up_command_in_their_own_session(tb):
    for h in state()["hosts"]:
        assert os.path.exists(f"/proc/{h['pid']}")
        assert os.getsid(h["pid"]) != os.getsid(0)


def test_own_hostname_and_machine_id(tb):
    ids = set()
    for h in state()["hosts"]:
        out = ssh(h["name"], "hostname; cat /etc/machine-id").stdout.split()
        assert out[0] == h["name"]
        ids.add(out[1])
    assert len(ids) == 3


def test_filesystems_are_isolated(tb):
    ssh("m3e2e-01", "echo secret > /root/only-on-01 && touch /etc/only-on-01")
    for other in ("m3e2e-02", "m3e2e-03"):
        res = ssh(other, "ls /root/only-on-01 /etc/only-on-01", check=False)
        assert res.returncode != 0
    assert not os.path.exists(os.path.join(state()["image"], "root/only-on-01"))


def test_systemd_is_pid1_and_running(tb):
    for h in state()["hosts"]:
        res = ssh(h["name"], "systemctl is-system-running --wait; ps -p 1 -o comm=", check=False)
        lines = res.stdout.split()
        # `running` is what we get (no failed units); `degraded` would still be a usable host.
        assert lines[0] in ("running", "degraded"), res.stdout + ssh(h["name"], "systemctl --failed", check=False).stdout
        assert lines[0] == "running", ssh(h["name"], "systemctl --failed", check=False).stdout
        assert lines[1] == "systemd"
        assert ssh(h["name"], "systemctl is-active ssh").stdout.strip() == "active"


def test_network_only_the_bridge(tb):
    out = ssh("m3e2e-02", "ip -4 route; ip -4 -o addr show dev eth0").stdout
    assert "default" not in out and "10.78.0.11/24" in out
    # hosts reach each other over the bridge
    banner = ssh("m3e2e-02", "timeout 3 bash -c 'head -c 7 </dev/tcp/10.78.0.12/22'").stdout
    assert banner.startswith("SSH-2.0")


def test_strict_host_keys_refuse_a_wrong_key(tb, tmp_path):
    st = state()
    h1, h2 = st["hosts"][0], st["hosts"][1]
    no_mux = ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
    ok = ssh(h1["name"], "true", *no_mux, check=False)
    assert ok.returncode == 0, ok.stderr
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"{h1['name']},{h1['address']} {h2['host_key']}\n")
    bad = ssh(h1["name"], "true", *no_mux, "-o", f"UserKnownHostsFile={wrong}", check=False)
    assert bad.returncode == 255 and "verification failed" in bad.stderr.lower()
    empty = tmp_path / "empty"
    empty.write_text("")
    unknown = ssh(h1["name"], "true", *no_mux, "-o", f"UserKnownHostsFile={empty}", check=False)
    assert unknown.returncode == 255 and "verification failed" in unknown.stderr.lower()
    # key-only root login: a key the host does not know gets no password prompt, just a refusal
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    res = subprocess.run(["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                          "-o", f"UserKnownHostsFile={st['ssh']['known_hosts']}",
                          "-o", "StrictHostKeyChecking=yes", "-i", str(other), f"root@{h1['address']}", "true"],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 255 and "permission denied (publickey)" in res.stderr.lower(), res.stderr


def test_testinfra_with_ssh_config(tb):
    import testinfra

    for h in state()["hosts"]:
        host = testinfra.get_host(f"ssh://{h['name']}", ssh_config=f"{STATE_DIR}/ssh_config")
        assert host.file("/etc/hostname").content_string.strip() == h["name"]
        assert host.service("ssh").is_running


def test_pyinfra_inventory(tb):
    env = {**os.environ, "M3_TESTBED": NAME, "M3_TESTBED_CONTROL": "1"}
    old = dict(os.environ)
    os.environ.update(env)
    try:
        inv = runpy.run_path(os.path.join(REPO, "inventories/testbed.py"))
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert [n for n, _ in inv["control"]] == ["m3e2e-01"]
    assert [n for n, _ in inv["workers"]] == ["m3e2e-02", "m3e2e-03"]
    data = dict(inv["workers"])["m3e2e-03"]
    assert data["ssh_hostname"] == data["m3_address"] == "10.78.0.12"
    assert data["ssh_strict_host_key_checking"] == "yes" and data["m3_interface"] == "eth0"
    res = subprocess.run([sys.executable, "-m", "pyinfra", "-y", "inventories/testbed.py", "exec", "--",
                          "cat /etc/hostname"], capture_output=True, text=True, cwd=REPO, env=env,
                         timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    for n in ("m3e2e-01", "m3e2e-02", "m3e2e-03"):
        assert f"[{n}] {n}" in res.stdout + res.stderr


def test_inventory_without_testbed_names_the_fix():
    env = {**os.environ, "M3_TESTBED": "m3none"}
    res = subprocess.run([sys.executable, "-c", "import runpy; runpy.run_path('inventories/testbed.py')"],
                         capture_output=True, text=True, cwd=REPO, env=env)
    assert res.returncode != 0 and "m3deploy testbed up 3 --name m3none" in res.stderr


def _exec_on_every_host(command, bound_s):
    """`pyinfra -y inventories/testbed.py exec -- COMMAND` on every host at once, as a user runs it. Returns the
    seconds it took; fails with the proxy's log and connections and each host's apt processes when any host does
    not finish within bound_s."""
    st = state()
    hosts = [h["name"] for h in st["hosts"]]
    # unbuffered: on a timeout, the output shows which hosts had finished (a pipe gets pyinfra's output in blocks)
    env = {**os.environ, "M3_TESTBED": NAME, "M3_TESTBED_CONTROL": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "pyinfra", "-y", "inventories/testbed.py", "exec", "--", command]
    t0 = time.monotonic()
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=bound_s)
    except subprocess.TimeoutExpired as exc:
        partial = "".join(b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
                          for b in (exc.stdout, exc.stderr))  # pyinfra prints the hosts' output on stderr
        done = [h for h in hosts if f"[{h}] Success" in partial]
        pytest.fail(f"`{command}` on {len(hosts)} hosts at once did not finish in {bound_s} s "
                    f"(finished: {done or 'none'}):\n{partial[-3000:]}\n{apt_diagnostics(NAME, hosts)}")
    out = res.stdout + res.stderr
    assert res.returncode == 0, f"{out[-3000:]}\n{apt_diagnostics(NAME, hosts)}"
    assert [h for h in hosts if f"[{h}] Success" not in out] == [], out[-3000:]
    return time.monotonic() - t0


def test_pyinfra_installs_a_package_on_every_host_at_once(tb):
    """Issue 8: `pyinfra -y inventories/testbed.py exec -- 'apt-get update && apt-get install -y jq'` on 3 fresh
    hosts hung > 300 s on 2 of them. The same command, as a user runs it: every host at once, fresh hosts, cold
    proxy cache (the fixture empties it). Every host must finish within APT_BOUND_S and have the package."""
    took = _exec_on_every_host("apt-get update && apt-get install -y jq", APT_BOUND_S)
    for h in state()["hosts"]:
        status = ssh(h["name"], "dpkg-query -W -f='${Status} ${Version}' jq && jq --version").stdout
        assert status.startswith("install ok installed "), (h["name"], status)
    print(f"apt-get update + install jq on {len(state()['hosts'])} hosts at once (cold proxy): {took:.1f} s")


def test_apt_install_through_the_proxy(tb):
    st = state()
    res = ssh("m3e2e-02", "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q tree"
                          " && tree --version", timeout=300)
    assert "tree v" in res.stdout
    assert ssh("m3e2e-03", "command -v tree", check=False).returncode != 0  # only on 02
    listen = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True).stdout
    port = st["apt_proxy"]["url"].rsplit(":", 1)[1]
    ours = f"pid={st['apt_proxy']['pid']},"  # other testbeds' proxies (other e2e lanes) listen on their own bridges
    socks = [line.split()[3] for line in listen.splitlines() if ours in line]
    assert socks == [f"10.78.0.1:{port}"]  # the bridge address only


def test_up_again_changes_nothing(tb):
    before = open(f"{STATE_DIR}/state.json").read()
    res = cli("up", "3", "--name", NAME)
    assert "no change" in res.stdout
    assert open(f"{STATE_DIR}/state.json").read() == before
    res = cli("up", "3", "--name", NAME, "--subnet", "10.79.0.0/24", check=False)
    assert res.returncode == 1 and "already runs on 10.78.0.0/24" in res.stderr


def test_up_repairs_a_crashed_host_and_grows(tb):
    st = state()
    h3 = st["hosts"][2]
    # crash host 03: kill everything in its cgroup (nspawn + its systemd)
    pids = {h3["pid"]}
    for cg in h3["cgroups"]:
        for d, _, files in os.walk(cg):
            pids.update(int(p) for p in open(os.path.join(d, "cgroup.procs")).read().split())
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    time.sleep(0.5)
    res = cli("up", "4", "--name", NAME)
    assert "m3e2e-03" in res.stdout and "m3e2e-04" in res.stdout
    st2 = state()
    assert [h["pid"] for h in st2["hosts"][:2]] == [h["pid"] for h in st["hosts"][:2]]
    assert st2["hosts"][2]["host_key"] == h3["host_key"]       # same disk, same identity
    assert ssh("m3e2e-03", "hostname", "-o", "ControlPath=none").stdout.strip() == "m3e2e-03"
    assert ssh("m3e2e-04", "hostname").stdout.strip() == "m3e2e-04"
    out = cli("status", "--name", NAME).stdout
    assert out.count("running") >= 4


def test_down_leaves_nothing(tb):
    st = state()
    pids = [h["pid"] for h in st["hosts"]] + [st["apt_proxy"]["pid"]]
    t0 = time.monotonic()
    cli("down", "--name", NAME)
    down_s = time.monotonic() - t0
    assert down_s < 10
    assert not any(n.startswith(NAME + "-") for n in subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"{NAME}-" not in links
    mounts = subprocess.run(["findmnt", "-rn", "-o", "TARGET,OPTIONS"], capture_output=True, text=True).stdout
    assert NAME not in mounts and STATE_DIR not in mounts
    for base in os.listdir("/sys/fs/cgroup"):
        assert not os.path.exists(f"/sys/fs/cgroup/{base}/m3deploy-testbed/{NAME}")
    assert not os.path.exists(STATE_DIR)
    # the inotify limit: `down` gives back what `up` raised, once no other testbed (another e2e lane) still needs it
    try:
        with open(SYSCTL_FILE) as f:
            others = json.load(f)["raised_by"]
    except FileNotFoundError:
        with open(INOTIFY) as f:
            assert f.read().strip() == tb["inotify_before"]
    else:
        assert NAME not in others and all(os.path.isdir(f"/var/lib/m3deploy/testbed/{n}") for n in others), others
    # processes: gone (a zombie waits for PID 1 to reap it; allow a few seconds)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
        time.sleep(0.2)
    assert not any(os.path.exists(f"/proc/{p}") for p in pids)
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                cmd = open(f"/proc/{p}/cmdline", "rb").read().decode(errors="replace")
            except OSError:
                continue
            assert STATE_DIR not in cmd and f"/run/netns/{NAME}-" not in cmd, cmd
    listen = subprocess.run(["ss", "-Hltn"], capture_output=True, text=True).stdout
    assert "10.78.0.1:" not in listen
    assert os.path.isdir(os.path.join(st["image"]))  # the image cache stays
    again = cli("down", "--name", NAME)
    assert "nothing was there" in again.stdout


def test_down_cleans_a_half_built_testbed():
    """No state.json, only leftovers found by name prefix (e.g. `up` killed half-way)."""
    if os.geteuid() != 0:
        pytest.fail("needs root")
    name = "m3e2h"
    subprocess.run(["ip", "netns", "add", f"{name}-01"], check=True)
    subprocess.run(["ip", "link", "add", f"{name}-br", "type", "bridge"], check=True)
    subprocess.run(["ip", "link", "add", f"{name}-v2", "type", "veth", "peer", "name", "eth0",
                    "netns", f"{name}-01"], check=True)
    cg = f"/sys/fs/cgroup/systemd/m3deploy-testbed/{name}/{name}-01/sub"
    if os.path.isdir("/sys/fs/cgroup/systemd"):
        os.makedirs(cg)
    os.makedirs(f"/var/lib/m3deploy/testbed/{name}/hosts/{name}-01/upper", exist_ok=True)
    res = cli("down", "--name", name)
    assert "down" in res.stdout
    assert f"{name}-" not in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"{name}-" not in subprocess.run(["ip", "netns"], capture_output=True, text=True).stdout
    assert not os.path.exists(f"/sys/fs/cgroup/systemd/m3deploy-testbed/{name}")
    assert not os.path.exists(f"/var/lib/m3deploy/testbed/{name}")


def test_lock_is_exclusive(monkeypatch):
    """A second command waits for the lock (M3_TESTBED_LOCK_TIMEOUT), then fails naming the holder."""
    monkeypatch.setenv("M3_TESTBED_LOCK_TIMEOUT", "1")
    from m3deploy.core.errors import M3Error
    from m3deploy.testbed import core
    holder = subprocess.Popen([sys.executable, "-c",
                               "import time; from m3deploy.testbed import core\n"
                               "with core.locked('up 9 --name other'):\n    print('held', flush=True); time.sleep(5)"],
                              stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert holder.stdout.readline().strip() == "held"
    try:
        with pytest.raises(M3Error, match=r"up 9 --name other"):
            core.down("m3e2l", log=None)
    finally:
        holder.kill()
        holder.wait()
