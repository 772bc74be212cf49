"""deploy.py itself, loaded the way `pyinfra -y inventories/<x>.py deploy.py` loads it
(pyinfra_cli.util.load_deploy_file, pyinfra.is_cli, every host's copy run in pyinfra's greenlet pool), on
`@fake/<name>` hosts that carry the shipped inventory's data and groups, for every shipped inventory
except testbed.py (deployed for real by the e2e tests). Nothing in m3deploy.deploy.context is replaced: the plan
is built and validated from this pyinfra inventory exactly as in a real run. What is asserted is what
pyinfra would run: the ops, in pyinfra's cluster-wide op order, with their commands and uploaded texts.

Fact values:
- NVIDIA (h200, b200, gb200): the real 2x H200 capture (tests/fixtures/h200x2-device/facts.json), with the
  GPU list replicated to the plan's GPU count. For B200/GB200 the GPU name is renamed to the plan's model
  and memory_mib set to the plan's per-GPU memory (the capture is an H200: 141 GB), and GB200 trays get
  arch aarch64 (Grace), the inventory's interface as default route and one active InfiniBand HCA. The
  disk is the capture's, with avail_bytes raised above the weights' size.
- AMD (mi300x, mi355x, mi355x_mxfp4): the mi300x *documentation* fixtures (tests/fixtures/mi300x, not
  captured), GPU name renamed to "AMD Instinct MI355X" and memory set to 288 GB for MI355X.
"""
from __future__ import annotations

import copy
import hashlib
import json
import re
import shlex
from pathlib import Path

import pytest
from pyinfra.facts.files import Directory, File, Sha1File
from pyinfra.facts.server import Os, Which

from m3deploy import facts as host_facts
from m3deploy.core import build as planmod
from m3deploy.core import inventory
from m3deploy.core.model import Service
from roles.preflight import PreflightFailed

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures"
DEVICE = json.loads((FIX / "h200x2-device" / "facts.json").read_text())
AMD_GPUS = host_facts.parse_amd_smi_static((FIX / "mi300x" / "amd-smi-static.json").read_text())
AMD_TOPO = host_facts.parse_rocm_topology((FIX / "mi300x" / "rocm-smi-showtopotype.json").read_text())
ROCM = host_facts.parse_rocm_version((FIX / "mi300x" / "rocm-version.txt").read_text())
INVENTORIES = ["gb200", "h200", "b200", "mi300x", "mi355x", "mi355x_mxfp4"]
HF_TOKEN = "hf_DeployTestTokenDoNotLeak0123456789"

# deploy names of the roles (their @deploy("...") titles) in the order deploy.py must run them
ROLE_ORDER = ["Preflight", "Configure apt's retries", "GPU drivers", "Container runtime", "Write the deploy manifest",
              "Ship Dynamo artifacts", "Container images", "Model weights", "Deploy etcd", "Deploy NATS", "Deploy the Dynamo frontend", "Deploy the edge", "Deploy the workers",
              "Roll the workers", "Check the cluster is serving", "Deploy monitoring", "Record the deployment"]
GPU_ROLES = {"GPU drivers", "Container runtime", "Container images", "Model weights"}


# ---------------------------------------------------------------------------------------------- controller

_runner = {}


@pytest.fixture(autouse=True)
def controller(tmp_path, monkeypatch, deploy_file):
    """The controller's side: secrets store and artifact cache under tmp_path, an HF token in the env,
    and a tiny complete wheelhouse (so the artifacts role never reaches PyPI)."""
    from m3deploy.controller import artifacts
    from roles import cluster_secrets

    _runner["run"] = deploy_file  # conftest's run_deploy_file, its patches undone after each test
    monkeypatch.setenv("M3DEPLOY_CONFIG", str(tmp_path / "config"))
    monkeypatch.setenv("M3DEPLOY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_TOKEN", HF_TOKEN)
    from m3deploy.controller import mockmodel

    cluster_secrets.generated.cache_clear()  # lru_cache keyed by cluster name only: it would outlive the tmp store
    artifacts._checked.clear()  # per-process memo of verified wheelhouses
    mockmodel._built.clear()
    # the hosts' wheelhouse, and the engine containers' (python3.12 on x86_64 and on GB200's aarch64)
    targets = (artifacts.HOSTS, artifacts.Target.container("3.12", "x86_64"),
               artifacts.Target.container("3.12", "aarch64"))
    for version, target in [("1.6.1", t) for t in targets]:
        wh = artifacts.wheelhouse_dir(version, target) / ".build-test"
        wh.mkdir(parents=True)
        (wh / "pip-25.0-py3-none-any.whl").write_bytes(b"not really a wheel")
        (wh / artifacts.REQS_FILE).write_text("ai-dynamo-runtime==1.6.1\n")
        artifacts.write_manifest(wh)
        artifacts.publish_wheelhouse(wh, version, target)

    def no_pypi(*a, **kw):
        raise AssertionError("the deploy tests must not download wheels")
    monkeypatch.setattr(artifacts, "_pip_download", no_pypi)
    yield tmp_path / "config"
    cluster_secrets.generated.cache_clear()


@pytest.fixture
def dynamo_ready(controller):
    """The controller's secrets store in a temp dir (M3DEPLOY_CONFIG); secrets are generated there."""
    return controller


# ---------------------------------------------------------------------------------------------- facts

def _nvidia_gpus(hp) -> list[dict]:
    base = DEVICE["gpus"][0]
    out = []
    for i in range(hp.gpus):
        g = dict(base, index=i, uuid=f"GPU-{i:08d}-0000-0000-0000-{hp.name[-12:]:>012}",
                 bus_id=f"00000000:{0x18 + i:02X}:00.0")
        if hp.gpu_model != base["name"]:  # B200 / GB200: the capture is an H200
            g.update(name=hp.gpu_model, memory_mib=int(hp.gpu_memory_gb * 1e9 / 2**20) + 1)
        out.append(g)
    return out


def _common(hp) -> dict:
    os_ = dict(DEVICE["os"])
    if hp.platform in ("gb200", "gb300"):
        os_["arch"] = "aarch64"
    need = max(hp.weights_gb, 1) * 10**9
    return {
        host_facts.OsInfo: os_,
        host_facts.ShmSize: DEVICE["shm"],
        host_facts.FreeSpace: lambda path: {**DEVICE["disk"], "avail_bytes": need + 500 * 10**9},
        host_facts.DefaultRouteInterface: hp.interface or DEVICE["default_interface"],
        host_facts.RdmaDevices: host_facts.parse_rdma("dev=mlx5_0 port=1 state=4: ACTIVE phys=5: LinkUp link_layer=InfiniBand "
                                    "netdev=ibp3s0") if hp.needs_rdma else [],
    }


def _markers(hp, cp) -> set[str]:
    """The weights role's completion marker of every repo the workers load (target, draft heads)."""
    from roles.weights import marker_path
    return {marker_path(hp.weights_dir, r.repo) for r in cp.model_repos}


def nvidia_facts(hp, cp, state: str = "provisioned") -> dict:
    t = _common(hp)
    t[File] = lambda path: None  # no /etc/dgx-release, no weights marker, no unit files yet
    if state == "fresh":
        return t
    imex = hp.platform in ("gb200", "gb300")
    fm_pkg = "nvidia-imex-580" if imex else "nvidia-fabricmanager-580"
    fm_svc = "nvidia-imex" if imex else "nvidia-fabricmanager"
    markers = _markers(hp, cp)
    # on a provisioned GB200 tray, /etc/nvidia-imex/nodes_config.cfg already lists the trays
    from roles.drivers import IMEX_NODES
    imex_text = "".join(f"{h.address}\n" for h in cp.hosts if h.platform == hp.platform and h.gpus)
    present = {**{m: {"mode": 644, "size": 0} for m in markers},
               IMEX_NODES: {"mode": 644, "size": len(imex_text), "user": "root", "group": "root"}}
    t.update({
        host_facts.NvidiaSmi: {"present": True, "gpus": _nvidia_gpus(hp), "error": ""},
        host_facts.NvidiaDriver: {k: DEVICE["driver"][k] for k in ("version", "flavor", "cuda_version")},
        host_facts.NvidiaTopology: DEVICE["topology"],
        host_facts.NvidiaPackages: {"cuda-keyring": "1.1-1", "nvidia-driver-580-open": "580.159.04-1ubuntu1",
                           fm_pkg: "580.159.04-1", "nvidia-container-toolkit": "1.17.4-1"},
        host_facts.RebootRequired: DEVICE["reboot"],
        host_facts.GpuServices: host_facts.parse_services(f"{fm_svc} enabled active\ndocker enabled active\n"),
        host_facts.DockerInfo: host_facts.parse_docker('present=yes\nclient=Docker version 27.5.1, build x\nserver=27.5.1\n'
                                     'ctk=NVIDIA Container Toolkit CLI version 1.17.4\n--- daemon.json\n'
                                     '{"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}}'),
        host_facts.DockerImage: lambda image: {"present": True, "id": "sha256:" + "1" * 64, "digests": [image]},
        File: lambda path: present.get(path),
        Directory: lambda path: {"mode": 755, "user": "root", "group": "root"} if path == "/etc/nvidia-imex" else None,
        Sha1File: lambda path: hashlib.sha1(imex_text.encode()).hexdigest() if path == IMEX_NODES else None,
    })
    return t


def amd_facts(hp, cp, state: str = "provisioned") -> dict:
    t = _common(hp)
    t[File] = lambda path: None
    if state == "fresh":
        return t
    gpus = copy.deepcopy(AMD_GPUS)[: hp.gpus]
    for g in gpus:
        if g["name"] != hp.gpu_model:  # MI355X: the documentation fixtures describe an MI300X
            g.update(name=hp.gpu_model, gfx="gfx950", memory_mib=int(hp.gpu_memory_gb * 1e9 / 2**20) + 1)
    markers = _markers(hp, cp)
    t.update({
        host_facts.AmdGpus: gpus, host_facts.AmdTopology: AMD_TOPO, host_facts.RocmVersion: ROCM,
        host_facts.AmdDevices: lambda user="root": host_facts.parse_amd_devices(
            f"kfd=yes\ndri=card0 card1 renderD128 renderD129\ngroups={user} video render\n"),
        host_facts.RebootRequired: host_facts.parse_reboot(""),
        host_facts.GpuServices: host_facts.parse_services("docker enabled active\n"),
        host_facts.DockerInfo: host_facts.parse_docker("present=yes\nclient=Docker version 27.5.1, build x\nserver=27.5.1\n"),
        host_facts.DockerImage: lambda image: {"present": True, "id": "sha256:" + "2" * 64, "digests": [image]},
        File: lambda path: {"mode": 644, "size": 0} if path in markers else None,
    })
    return t


def control_facts(hp, cp, state="provisioned") -> dict:
    return {host_facts.OsInfo: DEVICE["os"], host_facts.ShmSize: DEVICE["shm"],
            host_facts.FreeSpace: lambda path: DEVICE["disk"], File: lambda path: None}


# ---------------------------------------------------------------------------------------------- running

class Cluster:
    """One shipped inventory as pyinfra's CLI would see it, plus the plan built from it."""

    def __init__(self, inv: str, override_data: dict | None = None):
        self.inv = inv
        self.hosts = inventory.load_inventory(ROOT / "inventories" / f"{inv}.py", override_data=override_data)
        self.override_data = override_data
        self.plan = planmod.build(self.hosts, name=inv)
        self.groups: dict[str, list[str]] = {"control": [], "workers": [], inv: []}
        for h in self.hosts:
            for g in h.groups:
                self.groups.setdefault(g, []).append(h.name)
        assert self.groups[inv] == [h.name for h in self.hosts]

    def facts(self, name: str, state: str = "provisioned") -> dict:
        hp = self.plan.host(name)
        fn = {"nvidia": nvidia_facts, "amd": amd_facts}.get(hp.gpu_vendor, control_facts)
        return fn(hp, self.plan, state)

    def run(self, state: str = "provisioned", facts: dict | None = None, data: dict | None = None,
            raises: tuple = ()):
        """facts/data: {host name: {FactClass: value}} / {host name: {key: value}} on top of the defaults."""
        hosts = {}
        for h in self.hosts:
            # @fake answers every command with nothing: a Linux host whose tools (useradd...) exist
            t = {Os: "Linux", Which: lambda command: f"/usr/sbin/{command}", **self.facts(h.name, state)}
            t.update((facts or {}).get(h.name, {}))
            hosts[h.name] = {"data": {**h.data, **(data or {}).get(h.name, {})}, "facts": t}
        return _runner["run"](hosts, self.groups, override_data=self.override_data, raises=raises)


BARRIER = "Every host has reached: "


def role(op_name: str) -> str:
    return op_name.split(" | ")[0]


def short(o, host: str | None = None) -> str:
    """The op's name without its role, as seen on `host` (ops shared by hosts carry every host's name)."""
    names = [n for n in o.names if host and f"@fake/{host} " in n] or o.names
    return names[0].split(" | ", 1)[-1]


def changing(ops) -> list:
    """Ops that would run a command or upload (an op whose generator yields nothing is a no-op)."""
    return [o for o in ops if o.commands]


def roles_of(ops) -> list[str]:
    out: list[str] = []
    for o in ops:
        r = role(o.name)
        if r.startswith(BARRIER):
            continue
        if not out or out[-1] != r:
            out.append(r)
    return out


def global_roles(run) -> list[str]:
    """The role of every op in pyinfra's cluster-wide op order (each op runs on all its hosts first)."""
    out = []
    for h in run.state.get_op_order():
        names = run.state.get_op_meta(h).names
        assert len({role(n) for n in names}) == 1, f"one op shared by two roles: {names}"
        out.append(role(next(iter(names))))
    return out


def barrier_positions(run) -> list[int]:
    return [i for i, r in enumerate(global_roles(run)) if r.startswith(BARRIER)]


def op(ops, name: str):
    for o in ops:
        if any(n.split(" | ", 1)[-1] == name or n == name for n in o.names):
            return o
    raise AssertionError(f"no op {name!r}; ops: {[o.name for o in ops]}")


def assert_role_order(run, cluster: Cluster):
    """Each host runs its roles in ROLE_ORDER; cluster-wide, every control service and every GPU host's
    preparation is done before any worker starts, and every worker before the serving check."""
    for name, ops in run.ops_by_host.items():
        hp = cluster.plan.host(name)
        got = roles_of(ops)
        idx = [ROLE_ORDER.index(r) for r in got]  # an unknown role fails here, naming it
        assert idx == sorted(idx), (name, got)
        # apt's retry setting is on the host before any apt command (files/m3-apt.conf: apt < 3.0.3 can hang)
        apt_ops = [i for i, o in enumerate(ops) if any(re.search(r"\bapt-get\b|\bdpkg -i\b", c) for c in o.commands)]
        conf = [i for i, o in enumerate(ops) if "/etc/apt/apt.conf.d/80m3deploy" in o.uploads]
        assert not apt_ops or (conf and conf[0] < apt_ops[0]), (name, [ops[i].name for i in apt_ops[:1]], conf)
        if not hp.gpus:
            assert not set(got) & GPU_ROLES, (name, got)
            assert "Deploy the workers" not in got, (name, got)
        if "control" not in hp.groups:
            assert not set(got) & {"Deploy etcd", "Deploy NATS", "Deploy the Dynamo frontend"}, (name, got)
        barriers = [short(o) for o in ops if o.name.startswith(BARRIER)]
        assert barriers == [BARRIER + "control services and GPU hosts ready", BARRIER + "worker units written",
                            BARRIER + "workers started"], name
    seq = global_roles(run)
    first, second, third = barrier_positions(run)
    before, middle, rolling, after = seq[:first], seq[first + 1:second], seq[second + 1:third], seq[third + 1:]
    assert set(middle) <= {"Deploy the workers"}, middle
    assert "Deploy the workers" not in before + rolling + after
    # the rollout runs after every host has written its worker units, and before the serving check: nothing of
    # the frontend, etcd or NATS runs while workers roll
    assert set(rolling) <= {"Roll the workers"}, rolling
    assert "Roll the workers" not in before + middle + after
    assert set(after) <= {"Check the cluster is serving", "Deploy monitoring", "Record the deployment"}, after
    assert "Check the cluster is serving" not in before + middle + rolling
    assert "Record the deployment" not in before + middle + rolling
    # the deploy record is each host's last op (after the serving check) wherever the host runs something
    for name, ops in run.ops_by_host.items():
        hp = cluster.plan.host(name)
        if hp.services:
            assert ops[-1].name.startswith("Record the deployment | Record what runs on the host"), (name, ops[-1].name)


def roles_of_names(seq):
    out = []
    for r in seq:
        if not out or out[-1] != r:
            out.append(r)
    return out


def unexec(line: str) -> list[str]:
    """Split an ExecStart= value the way systemd does for what render.systemd_arg produces
    (double quotes with \\\\ and \\" escapes, $$ -> $, %% -> %)."""
    return shlex.split(line.replace("%%", "%").replace("$$", "$"))


def unit_field(text: str, key: str) -> list[str]:
    return [ln.split("=", 1)[1] for ln in text.splitlines() if ln.startswith(f"{key}=")]


def store_secrets(config: Path) -> list[str]:
    return [v for p in config.glob("*/secrets.json") for v in json.loads(p.read_text()).values()]


def assert_no_secret_leak(run, config: Path, secret_files=()):
    """secret_files: the plan's 0600 secret files (an MPI world's SSH keys), where their secrets belong."""
    secrets = [*store_secrets(config), HF_TOKEN]
    assert len(secrets) >= 4, secrets  # the store was used (etcd/NATS passwords) and the token is set
    for name, ops in run.ops_by_host.items():
        for o in ops:
            for s in secrets:
                assert s not in o.name, (name, o.name)
                assert not any(s in c for c in o.commands), (name, o.name)
                for dest, text in o.uploads.items():
                    if dest.endswith((".env", "/etcd/jwt.key")) or dest == "/etc/m3/hf_token" or dest in secret_files:
                        continue  # the 0600 env files, token file and etcd's signing key are where secrets belong
                    assert s not in text, (name, dest)


def worker_services(cluster, name) -> list[Service]:
    return [s for s in cluster.plan.host(name).services if s.kind == "worker"]


def check_worker_units(run, cluster, config: Path):
    """Each worker rank's env file (0600, every plan env var, its secrets) and unit are rendered; the
    unit runs the plan's exact command."""
    from m3deploy.controller.secrets import load_secrets
    from m3deploy.deploy.render import env_line

    store = load_secrets(cluster.plan.name)
    for name, ops in run.ops_by_host.items():
        for s in worker_services(cluster, name):
            env_op = op(ops, f"Render {s.env_file}")
            unit_op = op(ops, f"Render /etc/systemd/system/{s.unit}")
            assert f"UPLOAD {s.env_file}" in env_op.commands
            # created 0600 root *before* its content (secrets) is sent, and kept 0600
            cmds = env_op.commands
            up = cmds.index(f"UPLOAD {s.env_file}")
            assert any(f"chmod 0600 {s.env_file}" in c and "touch" in c for c in cmds[:up]), cmds
            assert f"chmod 0600 {s.env_file}" in cmds[-1], cmds
            env_lines = env_op.uploads[s.env_file].splitlines()
            dialect = "docker" if s.image else "systemd"
            for k, v in s.env:
                if k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA", "UCX_NET_DEVICES"):
                    continue  # completed from this host's live facts (context.host_plan)
                assert env_line(k, v, dialect) in env_lines, (name, k)
            for k, secret in s.secret_env:
                assert env_line(k, store[secret], dialect) in env_lines, (name, k)
            unit = unit_op.uploads[f"/etc/systemd/system/{s.unit}"]
            (exec_start,) = unit_field(unit, "ExecStart")
            assert unexec(exec_start) == list(s.command), (name, s.unit)
            if s.image:
                # docker reads the env file itself: `--env-file` inside the command, no EnvironmentFile=
                assert f"--env-file {s.env_file}" in shlex.join(s.command)
                assert unit_field(unit, "EnvironmentFile") == []
            else:
                assert unit_field(unit, "EnvironmentFile") == [s.env_file]
            start = op(ops, f"Start {s.unit}")
            assert f"systemctl start {s.unit}" in start.commands and f"systemctl enable {s.unit}" in start.commands
            # only if a file changed; workers are then restarted in turn by the rollout (m3_rollout="rolling")
            changed = f"Enable {s.unit} (the rollout restarts it)" if s.kind == "worker" else \
                f"Restart {s.unit} (its files changed)"
            assert op(ops, changed).conditional


# ---------------------------------------------------------------------------------------------- tests

@pytest.fixture
def cluster_run(dynamo_ready):
    def _run(inv, **kw):
        c = Cluster(inv)
        return c, c.run(**kw)
    return _run


@pytest.mark.parametrize("inv", INVENTORIES)
def test_provisioned_cluster_only_renders_and_starts_units(inv, cluster_run, controller):
    cluster, run = cluster_run(inv)
    assert run.error is None
    assert set(run.ops_by_host) == {h.name for h in cluster.hosts}
    assert_role_order(run, cluster)
    for name, ops in run.ops_by_host.items():
        hp = cluster.plan.host(name)
        got = roles_of(changing(ops))
        # skip-when-right: nothing of drivers/runtime/images/weights on a provisioned host
        assert not set(got) & GPU_ROLES, (name, got)
        cmds = " ".join(c for o in ops for c in o.commands)
        for bad in ("nvidia-driver-", "nvidia-ctk runtime configure", "amdgpu-install", "docker pull",
                    " download ", "reboot"):
            assert bad not in cmds, (name, bad)
        if hp.gpus:
            # apt's retry setting and the manifest (absent on these fake hosts: every file is new to them), then
            # the workers
            assert got[:3] == ["Configure apt's retries", "Write the deploy manifest", "Deploy the workers"], (name, got)
    check_worker_units(run, cluster, controller)
    # the serving check runs once, on the endpoint's host, last
    owners = [n for n, ops in run.ops_by_host.items() if any(role(o.name) == "Check the cluster is serving" for o in ops)]
    assert len(owners) == 1
    assert global_roles(run)[-2:] == ["Check the cluster is serving", "Record the deployment"]
    assert cluster.plan.host(owners[0]).address in cluster.plan.endpoint
    assert_no_secret_leak(run, controller)


@pytest.mark.parametrize("inv", INVENTORIES)
def test_fresh_hosts_get_every_role_in_order(inv, cluster_run, controller):
    cluster, run = cluster_run(inv, state="fresh")
    assert run.error is None
    assert_role_order(run, cluster)
    for name, ops in run.ops_by_host.items():
        hp = cluster.plan.host(name)
        if not hp.gpus:
            continue
        got = roles_of(ops)
        assert got[:6] == ["Configure apt's retries", "GPU drivers", "Container runtime", "Write the deploy manifest",
                           "Container images", "Model weights"], (name, got)
        assert got[6] == "Deploy the workers", (name, got)
        names = [short(o, name) for o in ops]
        # no m3_allow_reboot: the driver install stops the host with its name before anything runs on the GPUs
        stop = names.index(f"Stop: @fake/{name} needs a reboot")
        assert role(ops[0].name) == "Configure apt's retries", (name, ops[0].name)
        assert all(role(o.name) == "GPU drivers" for o in ops[1: stop + 1])
        if hp.gpu_vendor == "nvidia":
            drv = op(ops, next(n for n in names if n.startswith("Install nvidia-driver-580-open")))
            assert any("install -o DPkg::Lock::Timeout=900 nvidia-driver-580-open" in c for c in drv.commands)
            assert op(ops, "Add the nvidia runtime to /etc/docker/daemon.json").commands == [
                "nvidia-ctk runtime configure --runtime=docker"]
        else:
            assert any(n.startswith("Install ROCm 7.2") for n in names), names
        # each image is pulled, or (Dynamo workers) its base image is pulled and the image built on the host
        pulled = {s.base_image or s.image for s in hp.services if s.image}
        cmds = [c for o in ops if role(o.name) == "Container images" for c in o.commands]
        assert [c for c in cmds if c.startswith("docker pull")] == [f"docker pull {shlex.quote(i)}" for i in pulled]
        for svc in hp.services:
            if svc.base_image:
                assert any(c.startswith(f"docker build --network none -t {svc.image} ") for c in cmds)
        # every repo the workers load (gb200/b200: the EAGLE3 draft head too), each checked complete
        for r in cluster.plan.model_repos:
            assert any(c.endswith(f"download {r.repo}") for o in ops for c in o.commands), (name, r.repo)
        assert sum("| python3 - " in c for o in ops for c in o.commands) == len(cluster.plan.model_repos)
    check_worker_units(run, cluster, controller)
    assert_no_secret_leak(run, controller)


@pytest.mark.parametrize("inv", ["h200", "gb200", "mi355x"])
def test_reboot_needed_stops_or_reboots(inv, cluster_run):
    cluster = Cluster(inv)
    gpu_hosts = [h.name for h in cluster.plan.hosts if h.gpus]
    pending = host_facts.parse_reboot("nvidia_loaded=570.124.06\nnvidia_installed=580.159.04\n" if
                             cluster.plan.hosts[-1].gpu_vendor == "nvidia" else "file=yes\npkg=linux-image-6.8.0-60\n")
    facts = {n: {host_facts.RebootRequired: pending} for n in gpu_hosts}
    run = cluster.run(facts=facts)
    assert run.error is None
    for n in gpu_hosts:
        ops = run.for_host(n)
        assert [short(o, n) for o in changing(ops) if role(o.name) == "GPU drivers"] == [f"Stop: @fake/{n} needs a reboot"]
        assert "m3_allow_reboot" in op(ops, f"Stop: @fake/{n} needs a reboot").commands[0]
    run = cluster.run(facts=facts, data={n: {"m3_allow_reboot": True} for n in gpu_hosts})
    for n in gpu_hosts:
        assert [short(o, n) for o in changing(run.for_host(n)) if role(o.name) == "GPU drivers"] == [
            "Reboot to load the GPU driver", "Check the GPU driver after the reboot"]
    assert_role_order(run, cluster)


@pytest.mark.parametrize("inv", ["h200", "b200", "gb200"])
def test_wrong_nvidia_driver_branch_is_replaced(inv, cluster_run):
    cluster = Cluster(inv)
    facts = {}
    for h in cluster.plan.hosts:
        if h.gpus:
            pk = dict(cluster.facts(h.name)[host_facts.NvidiaPackages])
            del pk["nvidia-driver-580-open"]
            pk["nvidia-driver-570-open"] = "570.124.06-1"
            facts[h.name] = {host_facts.NvidiaDriver: {"version": "570.124.06", "flavor": "open", "cuda_version": "12.8"},
                             host_facts.NvidiaPackages: pk}
    run = cluster.run(facts=facts)
    assert run.error is None  # an old driver is the drivers role's job, not a preflight stop
    for n in facts:
        got = [short(o, n) for o in changing(run.for_host(n)) if role(o.name) == "GPU drivers"]
        assert got == ["Install nvidia-driver-580-open", f"Stop: @fake/{n} needs a reboot"], got
        assert not any(o.commands == ["apt-get update"] for o in run.for_host(n))


@pytest.mark.parametrize("inv", ["mi300x", "mi355x"])
def test_old_rocm_is_upgraded(inv, cluster_run):
    cluster = Cluster(inv)
    (n,) = [h.name for h in cluster.plan.hosts if h.gpus]
    run = cluster.run(facts={n: {host_facts.RocmVersion: "6.4.1"}})
    got = [short(o, n) for o in run.for_host(n) if role(o.name) == "GPU drivers"]
    assert got[0] == "Install amdgpu-install 7.2" and got[-1] == f"Stop: @fake/{n} needs a reboot", got


@pytest.mark.parametrize("inv", INVENTORIES)
def test_missing_gpus_stop_the_deploy_before_any_change(inv, cluster_run):
    from pyinfra.api.exceptions import PyinfraError

    cluster = Cluster(inv)
    victim = [h for h in cluster.plan.hosts if h.gpus][-1]
    facts = cluster.facts(victim.name)
    if victim.gpu_vendor == "nvidia":
        smi = facts[host_facts.NvidiaSmi]
        fewer = {host_facts.NvidiaSmi: {**smi, "gpus": smi["gpus"][:-1]}}
    else:
        fewer = {host_facts.AmdGpus: facts[host_facts.AmdGpus][:-1]}
    run = cluster.run(facts={victim.name: fewer}, raises=(PreflightFailed,))
    err = run.error
    # raised from load_deploy_file (pyinfra's prepare stage) as a PyinfraError: the CLI prints it and
    # exits before `run_ops`, so no op runs on any host
    assert isinstance(err, PreflightFailed) and isinstance(err, PyinfraError)
    msg = str(err)
    assert "preflight failed on 1 host" in msg
    assert f"@fake/{victim.name}: gpu-count: {victim.gpus - 1} GPUs found, plan needs {victim.gpus}" in msg
    # one error for the whole cluster, even though every host's copy of deploy.py calls preflight()
    assert msg.count("gpu-count") == 1


@pytest.mark.parametrize("inv,override,problem", [
    ("h200", {"m3_variant": "nvfp4"}, "nvfp4"),
    ("mi355x", {"m3_parallel": "tp16"}, "tp16"),
])
def test_invalid_plan_exits_2_before_any_op(inv, override, problem, capsys):
    cluster = Cluster.__new__(Cluster)
    cluster.inv, cluster.override_data = inv, override
    cluster.hosts = inventory.load_inventory(ROOT / "inventories" / f"{inv}.py")
    cluster.groups = {"control": [], "workers": [h.name for h in cluster.hosts], inv: [h.name for h in cluster.hosts]}
    hosts = {h.name: {"data": dict(h.data), "facts": {}} for h in cluster.hosts}
    from m3deploy.deploy.context import InvalidPlan

    run = _runner["run"](hosts, cluster.groups, override_data=override, raises=(InvalidPlan,))
    assert isinstance(run.error, InvalidPlan) and run.error.exit_code == 2
    assert run.state.get_op_order() == []
    assert all(ops == [] for ops in run.ops_by_host.values())
    err = str(run.error.message)  # what pyinfra's CLI prints once (InvalidPlan.show)
    assert err.startswith("invalid cluster plan, nothing was changed:")
    assert problem in err, err


def test_missing_controller_artifact_exits_2_before_any_op(tmp_path):
    """A controller artifact that cannot be had (here an image archive, air-gapped) stops the whole run at
    prepare, once, naming the fix, before any host is touched (m3deploy.controller.prepare runs before per-host work)."""
    from m3deploy.deploy.context import InvalidPlan

    hosts_ = inventory.load_inventory(ROOT / "inventories" / "h200.py")
    groups = {"control": [], "workers": [h.name for h in hosts_], "h200": [h.name for h in hosts_]}
    hosts = {h.name: {"data": dict(h.data), "facts": {}} for h in hosts_}
    run = _runner["run"](hosts, groups, override_data={"m3_image_archive_dir": str(tmp_path)}, raises=(InvalidPlan,))
    assert isinstance(run.error, InvalidPlan) and run.error.exit_code == 2
    assert run.state.get_op_order() == []
    err = str(run.error.message)
    assert err.startswith("the controller could not prepare the deploy, nothing was changed:")
    assert f"m3deploy save-images INVENTORY {tmp_path}" in err, err


def test_gb200_tp8_spans_two_trays_rank0_on_tray_01(cluster_run, controller):
    cluster, run = cluster_run("gb200")
    ctl, t1, t2 = (h.name for h in cluster.hosts)
    assert cluster.plan.host(ctl).groups == ("control",)
    assert roles_of(run.for_host(ctl)) == ["Configure apt's retries", "Write the deploy manifest",
                                           "Ship Dynamo artifacts", "Deploy etcd",
                                           "Deploy NATS", "Deploy the Dynamo frontend", "Roll the workers",
                                           "Check the cluster is serving", "Record the deployment"]
    units = {}
    for n in (t1, t2):
        (s,) = worker_services(cluster, n)
        units[n] = unexec(unit_field(op(run.for_host(n), f"Render /etc/systemd/system/{s.unit}")
                                     .uploads[f"/etc/systemd/system/{s.unit}"], "ExecStart")[0])
    a, b = units[t1], units[t2]
    t1_addr = cluster.plan.host(t1).address
    assert a[a.index("--node-rank") + 1] == "0" and "--headless" not in a
    assert b[b.index("--node-rank") + 1] == "1" and b[-1] == "--headless"
    assert a[a.index("--master-addr") + 1] == b[b.index("--master-addr") + 1] == t1_addr
    assert a[a.index("--nnodes") + 1] == "2"
    assert cluster.plan.workers[0].hosts == (t1, t2)
    # The live RDMA facts reach the worker env file (context.host_plan completes it from facts)
    env = op(run.for_host(t1), "Render /etc/m3/m3-worker@0.env").uploads["/etc/m3/m3-worker@0.env"]
    assert "NCCL_IB_HCA=mlx5_0" in env and "NCCL_SOCKET_IFNAME=enP5p9s0" in env
    # the frontend is native: its unit reads the 0600 env file with EnvironmentFile=
    fe = cluster.plan.host(ctl).service("m3-frontend")
    unit = op(run.for_host(ctl), "Render /etc/systemd/system/m3-frontend.service").uploads[
        "/etc/systemd/system/m3-frontend.service"]
    assert unit_field(unit, "EnvironmentFile") == [fe.env_file]
    assert unexec(unit_field(unit, "ExecStart")[0]) == list(fe.command)
    # control services come up before any worker, cluster-wide
    seq = roles_of_names(global_roles(run))
    assert seq.index("Deploy the Dynamo frontend") < seq.index("Deploy the workers")


def test_gb200_trtllm_under_dynamo_is_one_mpi_world(dynamo_ready, controller):
    """deploy.py for Dynamo's TensorRT-LLM recipe on two trays (m3deploy.core.mpi): tray 1's unit runs mpirun,
    tray 2's only the sshd it reaches, each tray gets its MPI files (the keys 0600, from the store), and no secret
    lands anywhere else."""
    from m3deploy.core import mpi

    cluster = Cluster("gb200", override_data={"m3_engine": "trtllm", "m3_features": ["text-only"],
                                              "m3_variant": "bf16", "m3_parallel": "tp8-ep"})
    run = cluster.run()
    assert run.error is None
    _, t1, t2 = (h.name for h in cluster.hosts)
    argv = {}
    for n in (t1, t2):
        (s,) = worker_services(cluster, n)
        argv[n] = unexec(unit_field(op(run.for_host(n), f"Render /etc/systemd/system/{s.unit}")
                                    .uploads[f"/etc/systemd/system/{s.unit}"], "ExecStart")[0])
        for path, _ in s.files + s.secret_files:
            assert f"UPLOAD {path}" in op(run.for_host(n), f"Ship {path}").commands
        for path, _ in s.secret_files:
            assert any("0600" in c for c in op(run.for_host(n), f"Ship {path}").commands), path
    assert argv[t1][argv[t1].index("--entrypoint") + 1] == "/opt/hpcx/ompi/bin/mpirun"
    assert "trtllm-llmapi-launch" in argv[t1] and "--node-rank" not in argv[t1]
    assert argv[t2][argv[t2].index("--entrypoint") + 1] == "/usr/sbin/sshd"
    store = json.loads(next(controller.glob("*/secrets.json")).read_text())
    assert set(mpi.SECRETS) <= set(store)
    assert_no_secret_leak(run, controller, {p for h in cluster.plan.hosts for s in h.services
                                            for p, _ in s.secret_files})


def test_mi355x_two_engines_two_units(cluster_run):
    cluster, run = cluster_run("mi355x")
    (n,) = [h.name for h in cluster.hosts]
    ops = run.for_host(n)
    for i, devices in ((0, "0,1,2,3"), (1, "4,5,6,7")):
        unit = op(ops, f"Render /etc/systemd/system/m3-worker@{i}.service").uploads[
            f"/etc/systemd/system/m3-worker@{i}.service"]
        assert f"--env-file /etc/m3/m3-worker@{i}.env" in unit_field(unit, "ExecStart")[0]
        env = op(ops, f"Render /etc/m3/m3-worker@{i}.env").uploads[f"/etc/m3/m3-worker@{i}.env"]
        assert devices in env or devices in unit, (i, env)


def test_hf_token_only_in_its_0600_file(cluster_run, controller):
    cluster, run = cluster_run("h200", state="fresh")
    (n,) = [h.name for h in cluster.hosts]
    ops = run.for_host(n)
    up = op(ops, "Upload the Hugging Face token to /etc/m3/hf_token (0600)")
    assert up.uploads["/etc/m3/hf_token"].strip() == HF_TOKEN
    assert any("chmod 600 /etc/m3/hf_token" in c for c in up.commands)
    names = [o.name for o in ops]
    assert names.index(up.name) < names.index("Model weights | Remove /etc/m3/hf_token")
    assert_no_secret_leak(run, controller)


# ---------------------------------------------------------------------------------------------- known bugs

def test_dynamo_secrets_from_a_fresh_store(controller):
    """The plan's secret names are the ones the controller's store generates."""
    assert Cluster("gb200").run().error is None


def test_nats_port_names_match_the_plan(controller):
    cluster = Cluster("gb200")
    nats = next(s for h in cluster.plan.hosts for s in h.services if s.kind == "nats")
    assert {p.name for p in nats.ports} == {"client", "monitor"}
    assert cluster.run().error is None


def test_gb200_worker_image_is_built_not_pulled(cluster_run):
    """Under Dynamo the worker image is built on the tray, offline, FROM the pinned engine image plus the
    ai-dynamo wheels for the container (python3.12, aarch64 on GB200)."""
    cluster, run = cluster_run("gb200", state="fresh")
    t1 = cluster.hosts[1].name
    (s,) = worker_services(cluster, t1)
    assert s.base_image and s.image.startswith("m3deploy/dynamo-vllm:1.6.1-")
    ops = run.for_host(t1)
    cmds = [c for o in ops for c in o.commands]
    assert f"docker pull {s.image}" not in cmds
    assert f"docker pull {s.base_image}" in cmds
    build = next(o for o in ops if o.name.endswith(f"Build {s.image} (offline, FROM {s.base_image})"))
    assert any(c.startswith(f"docker build --network none -t {s.image} ") for c in build.commands)
    dockerfile = next(text for o in ops for dest, text in o.uploads.items() if dest.endswith("/Dockerfile"))
    assert f"FROM {s.base_image}" in dockerfile and "--no-index" in dockerfile
    assert "ai-dynamo==1.6.1" in dockerfile and "import dynamo.vllm" in dockerfile
    names = [o.name for o in ops]
    assert names.index(build.name) < next(i for i, n in enumerate(names) if "m3-worker@0.service" in n)
    # the container's wheelhouse goes to the tray as one archive, checked against its manifest, before the build
    ships = [o for o in ops if "wheelhouse for " + s.image in o.name]
    assert len(ships) == 1 and names.index(ships[0].name) < names.index(build.name), names
    assert any("sha256sum --quiet --strict -c SHA256SUMS" in c for c in ships[0].commands), ships[0].commands
    assert not [n for n in names if n.split(" | ")[-1].startswith("Ship ") and n.endswith(f"for {s.image}")
                and "wheelhouse" not in n], names  # no operation per wheel


def test_nats_requires_the_credentials_clients_get(cluster_run):
    cluster, run = cluster_run("gb200")
    ctl = cluster.hosts[0].name
    conf = op(run.for_host(ctl), "Render /etc/m3/nats.conf").uploads["/etc/m3/nats.conf"]
    assert "authorization {" in conf


@pytest.mark.parametrize("inv", ["gb200", "h200"])
def test_readiness_waits_are_wired(inv, cluster_run):
    """Every planned service with a readiness check gets its controller-side wait, after its start and only if
    this run (re)started it (`_if`); Dynamo workers then wait until the frontend lists them. Nothing polls under
    @fake: the ops are only prepared."""
    cluster, run = cluster_run(inv)
    for name, ops in run.ops_by_host.items():
        hp = cluster.plan.host(name)
        names = [short(o, name) for o in ops]
        for s in hp.services:
            if not (s.readiness and s.readiness.kind == "http"):
                continue
            wait = next(i for i, n in enumerate(names) if n.startswith(f"Wait for {s.unit} "))
            assert ops[wait].conditional and ops[wait].commands == ["PYTHON _wait"], (name, s.unit)
            start = max(i for i, n in enumerate(names) if s.unit in n and not n.startswith("Wait"))
            assert start < wait, (name, s.unit, names)
        # engine instances roll (m3_rollout = rolling, the default): roles/rolling.py starts them and waits until
        # the frontend routes to each; a per-host "frontend lists" wait is only for services started by the host
        # itself (none here), else it would wait for workers the rollout has not started yet (cold deploy)
        listed = [n for n in names if n.startswith("Wait until the frontend lists")]
        assert listed == [], (name, listed)
    rolls = [n for h, ops in run.ops_by_host.items() for n in (short(o, h) for o in ops)
             if n.startswith("Roll the changed workers")]
    assert rolls, "no rollout op: nothing would start the workers and wait until the frontend lists them"


def test_the_plan_is_built_once_per_deploy(dynamo_ready, monkeypatch):
    """GB200 trays are multi-host GPU hosts: their fact env (NCCL/UCX) is overlaid onto the one plan
    (core.build.with_fact_env), never by rebuilding and revalidating the cluster plan per host."""
    cluster = Cluster("gb200")
    assert sum(1 for h in cluster.plan.hosts if h.needs_rdma) == 2
    calls = []
    build = planmod.build
    monkeypatch.setattr(planmod, "build", lambda *a, **kw: calls.append(1) or build(*a, **kw))
    run = cluster.run()
    assert run.error is None
    assert len(calls) == 1
