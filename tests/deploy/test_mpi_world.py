"""The GB200 TensorRT-LLM-under-Dynamo worker (Dynamo's MiniMax-M3 recipe: BF16, TP8/EP8 over two 4-GPU trays)
as ONE MPI world (m3deploy.core.mpi), through pyinfra's @fake connector: tray 1's unit runs mpirun, tray 2 runs
only the sshd mpirun reaches; the SSH keys come from the controller's store as 0600 root files; render shows
them masked and the manifest names every one. Nothing here can run an MPI world (no GPU, no image): what is
assumed is in docs/DYNAMO.md."""
from __future__ import annotations

import json
import shlex
import stat

import pytest
from click.testing import CliRunner

from m3deploy.cli import load_plan, main
from m3deploy.controller import secrets as store
from m3deploy.core import mpi
from m3deploy.core.errors import ValidationError
from m3deploy.deploy import hostfiles
from roles.workers import deploy_workers

TRTLLM = ["m3_engine=trtllm", "m3_serving=dynamo", 'm3_features=["text-only"]', "m3_variant=bf16",
          "m3_parallel=tp8-ep"]
T1, T2 = "gb200-r01-t01", "gb200-r01-t02"


@pytest.fixture
def cp(monkeypatch, tmp_path):
    from roles import cluster_secrets

    monkeypatch.setenv("M3DEPLOY_CONFIG", str(tmp_path / "config"))
    cluster_secrets.generated.cache_clear()  # lru_cache keyed by cluster name only: it would outlive the tmp store
    yield load_plan("inventories/gb200.py", TRTLLM, facts=False)
    cluster_secrets.generated.cache_clear()


def _both(fake, cp):
    """One @fake run over both trays (the harness serves one run's facts per test)."""
    return fake(deploy_workers, cluster_plan=cp, hosts={T1: {}, T2: {}})


def _shipped(ops, dest):
    """The op of this host that ships `dest` (an op shared by both hosts' call site carries each host's name)."""
    return next(o for o in ops if dest in o.uploads)


def _unit_exec(ops, unit="m3-worker@0"):
    text = _shipped(ops, f"/etc/systemd/system/{unit}.service").uploads[f"/etc/systemd/system/{unit}.service"]
    return shlex.split(next(ln for ln in text.splitlines() if ln.startswith("ExecStart=")).removeprefix("ExecStart="))


def test_tray1_runs_the_mpi_world_and_tray2_only_its_sshd(fake, cp):
    w = cp.workers[0]
    assert w.hosts == (T1, T2) and w.tensor_parallel == 8
    head, follower = cp.host(T1).service("m3-worker@0"), cp.host(T2).service("m3-worker@0")
    run = _both(fake, cp)
    argv = _unit_exec(run.for_host(T1))
    # docker run ... --entrypoint mpirun IMAGE <mpirun options> trtllm-llmapi-launch python3 -m dynamo.trtllm
    assert argv[argv.index("--entrypoint") + 1].endswith("/mpirun")
    tail = argv[argv.index(head.image) + 1:]
    assert tail[tail.index("-np") + 1] == "8"
    hostfile = tail[tail.index("--hostfile") + 1]
    assert dict(head.files)[hostfile] == "10.20.1.11 slots=4\n10.20.1.12 slots=4\n"  # rank 0's tray first
    launch = tail.index("trtllm-llmapi-launch")
    assert tail[launch + 1:launch + 4] == ["python3", "-m", "dynamo.trtllm"]
    forwarded = {tail[i + 1] for i, a in enumerate(tail[:launch]) if a == "-x"}
    assert {"ETCD_ENDPOINTS", "NCCL_SOCKET_IFNAME", "DYN_SYSTEM_PORT"} <= forwarded
    assert not forwarded & {k for k, _ in head.secret_env}  # passwords stay with rank 0
    # rank 0 keeps Dynamo's readiness and registration, and starts after the follower's sshd
    assert head.readiness.url == "http://10.20.1.11:9090/health"
    assert f"{T2}/m3-worker@0" in head.after
    # tray 2 runs no engine: its unit's command is sshd, on the plan's port of its cluster address
    argv2 = _unit_exec(run.for_host(T2))
    after_image = argv2[argv2.index(follower.image) + 1:]
    assert argv2[argv2.index("--entrypoint") + 1] == "/usr/sbin/sshd" and after_image[:2] == ["-D", "-e"]
    assert not any("dynamo" in a or "trtllm" in a or "mpirun" in a for a in after_image)
    sshd = dict(follower.files)[after_image[after_image.index("-f") + 1]]
    assert "Port 2222\nListenAddress 10.20.1.12\n" in sshd and "PasswordAuthentication no" in sshd
    assert (follower.readiness.kind, follower.readiness.port) == ("tcp", 2222)
    # mpirun's ssh: the follower's pinned host key, the plan's port and key, never a password or a prompt
    ssh_config = dict(head.files)[tail[tail.index("plm_rsh_args") + 1].removeprefix("-F ")]
    for line in ("Host 10.20.1.12", "Port 2222", f"IdentityFile {mpi.paths(0)['key']}", "StrictHostKeyChecking yes",
                 f"UserKnownHostsFile {mpi.paths(0)['known_hosts']}", "BatchMode yes"):
        assert line in ssh_config
    # both containers run as root (the runtime image declares USER dynamo; the key files are 0600 root)
    for a in (argv, argv2):
        assert a[a.index("--user") + 1] == "0:0"
    assert follower.env == () and follower.secret_env == ()


def test_keys_are_0600_files_from_the_store_never_in_argv_or_plan(fake, cp):
    data = store.ensure_secrets(cp.name, names=mpi.SECRETS)
    path = store.secrets_path(cp.name)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert data[mpi.SSH_KEY].startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert data[mpi.SSH_KEY_PUB].startswith("ssh-ed25519 ") and data[mpi.HOST_KEY_PUB].startswith("ssh-ed25519 ")
    plan_text = json.dumps(cp.to_dict(provenance=True))
    for name in mpi.SECRETS:
        assert data[name].split()[1] not in plan_text
    run = _both(fake, cp)
    p = mpi.paths(0)
    for host, dest, name in ((T1, p["key"], mpi.SSH_KEY), (T2, p["host_key"], mpi.HOST_KEY)):
        ops = run.for_host(host)
        op = _shipped(ops, dest)
        assert op.uploads[dest] == data[name]
        assert any("0600" in c for c in op.commands), op.commands
        assert not any(data[n].split()[1] in c for o in ops for c in o.commands for n in mpi.SECRETS)
    assert _shipped(run.for_host(T1), p["known_hosts"]).uploads[p["known_hosts"]] == f"[10.20.1.12]:2222 {data[mpi.HOST_KEY_PUB]}\n"
    assert _shipped(run.for_host(T2), p["authorized_keys"]).uploads[p["authorized_keys"]] == f'restrict,from="10.20.1.11" {data[mpi.SSH_KEY_PUB]}\n'


def test_render_shows_the_key_files_masked_and_the_manifest_names_them(cp, tmp_path):
    out = tmp_path / "r"
    res = CliRunner().invoke(main, ["render", "inventories/gb200.py", str(out), "--no-facts",
                                    *(a for d in TRTLLM for a in ("--data", d))])
    assert res.exit_code == 0, res.output
    p = mpi.paths(0)
    for host, names in ((T1, ("hosts", "ssh_config", "key", "known_hosts")),
                        (T2, ("sshd_config", "host_key", "authorized_keys"))):
        manifest = hostfiles.manifest(cp, cp.host(host))
        files = {f.path: f for f in hostfiles.host_files(cp, cp.host(host))}
        for n in names:
            assert p[n] in manifest["files"], (host, n)
            rendered = out / host / p[n].lstrip("/")
            assert rendered.is_file(), rendered
        for n in ("key", "known_hosts", "host_key", "authorized_keys"):
            if p[n] in files:
                assert files[p[n]].mode == "0600" and files[p[n]].secret
                assert (out / host / p[n].lstrip("/")).read_text().startswith("<secret: ")


def test_standalone_trtllm_over_two_trays_is_still_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("M3DEPLOY_CONFIG", str(tmp_path / "config"))
    with pytest.raises(ValidationError) as e:
        load_plan("inventories/gb200.py", [*TRTLLM[:1], "m3_serving=standalone", *TRTLLM[2:]], facts=False)
    assert any("no multi-host launch" in p and "m3_serving = 'dynamo'" in p for p in e.value.problems)


def test_env_from_rank0s_facts_reaches_every_rank(cp):
    """Networking env completed from tray 1's facts (NCCL_IB_HCA, UCX_NET_DEVICES) goes into its env file and is
    forwarded by its mpirun, before the launcher's wrapper, like the plan's own env."""
    from m3deploy.core.build import with_fact_env

    hp = with_fact_env(cp, cp.host(T1), {"NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_SOCKET_IFNAME": "other"})
    head = hp.service("m3-worker@0")
    argv = list(head.argv)
    launch = argv.index("trtllm-llmapi-launch")
    assert dict(head.env)["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"
    assert argv[launch - 2:launch] == ["-x", "NCCL_IB_HCA"]
    assert argv.count("NCCL_SOCKET_IFNAME") == 1  # the inventory's m3_interface set it already


def test_rolling_restart_starts_the_followers_sshd_before_rank0(cp, monkeypatch, tmp_path):
    """roles/rolling.py starts an instance's ranks by their `after`: an MPI world's sshd before rank 0's mpirun,
    a vLLM worker's rank 0 before its headless ranks."""
    from roles import rolling

    assert rolling._waves(cp, [cp.workers[0]]) == [[f"{T2}/m3-worker@0"], [f"{T1}/m3-worker@0"]]
    vllm = load_plan("inventories/gb200.py", [], facts=False)
    assert rolling._waves(vllm, [vllm.workers[0]]) == [[f"{T1}/m3-worker@0"], [f"{T2}/m3-worker@0"]]


def test_the_followers_sshd_port_is_checked_like_every_plan_port(monkeypatch, tmp_path):
    monkeypatch.setenv("M3DEPLOY_CONFIG", str(tmp_path / "config"))
    with pytest.raises(ValidationError) as e:
        load_plan("inventories/gb200.py", [*TRTLLM, "ssh_port=2222"], facts=False)
    assert any(p.startswith(f"host {T2} (--data): port 2222 of m3-worker@0 (mpi-ssh, a fixed port")
               and "is the host's ssh_port" in p and "Fix: change ssh_port" in p  # engines.yaml's port: no key
               for p in e.value.problems), e.value.problems
