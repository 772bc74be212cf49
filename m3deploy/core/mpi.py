"""A worker over several hosts that is ONE MPI world (TensorRT-LLM under Dynamo), as data in engines.yaml
(`mpi_world:` per serving mode) and built here from the per-rank services m3deploy.core.build made.

Dynamo: "to run a single Dynamo+TRTLLM Worker that spans multiple nodes ... the set of nodes need to be launched
together in the same MPI world, such as via `mpirun` or `srun`" (ai-dynamo/dynamo docs/backends/trtllm/multinode/
trtllm-multinode-examples.md). Without Slurm, it is launched as Dynamo's Kubernetes operator launches it
(ai-dynamo/dynamo deploy/operator/internal/dynamo/backend_trtllm.go: the leader's mpirun over SSH to an sshd on
port 2222 in every other node's container), with the keys and host pinning from the plan:

- rank 0's unit runs `mpirun -np <GPUs> --hostfile <hosts> --mca plm_rsh_args "-F <ssh config>" -x <env> ...
  trtllm-llmapi-launch python3 -m dynamo.trtllm ...` in the worker image. Host pinning: the hostfile names each
  host's cluster address with `slots=<its GPUs>`, rank 0's first (one file: `-H a:4` is ambiguous for IPv6).
  `-x NAME` forwards rank 0's plan env (names only; values from its 0600 env file) to every rank; its secret
  env (etcd/NATS passwords) stays with rank 0, the one rank that runs Dynamo's runtime.
- ranks > 0 run only an sshd in the same image, on a plan port of their cluster address, started before rank 0;
  mpirun's ssh starts Open MPI's orted inside that container (GPUs, IMEX channel, libraries: the host's own sshd
  would start it outside them). No second engine runs there: its ranks are MPI ranks of rank 0's world.
- one ed25519 client key pair and one host key pair per cluster, generated once by the controller and kept in
  its 0600 secrets store (m3deploy.controller.secrets, SECRETS below); on hosts only as 0600 root files
  (Service.secret_files), mounted read-only; rank 0 pins the followers' host key (StrictHostKeyChecking yes),
  the followers take the client key from rank 0's address only.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from m3deploy.core.model import Port, Provenance, Readiness, Service

# the controller's secrets (m3deploy.controller.secrets.PAIRS makes each private key with its public half)
SSH_KEY, SSH_KEY_PUB, HOST_KEY, HOST_KEY_PUB = "mpi-ssh-key", "mpi-ssh-key-pub", "mpi-host-key", "mpi-host-key-pub"
SECRETS = (SSH_KEY, SSH_KEY_PUB, HOST_KEY, HOST_KEY_PUB)
SOURCE = "m3deploy/core/data/engines.yaml"


def paths(slot: int) -> dict[str, str]:
    """The MPI world's host files of worker slot `slot` (in /etc/m3: the manifest names them, teardown removes)."""
    base = f"/etc/m3/m3-worker@{slot}.mpi"
    return {k: f"{base}-{k}" for k in ("hosts", "ssh_config", "key", "known_hosts",
                                       "sshd_config", "host_key", "authorized_keys")}


def spec(rules: Mapping[str, Any], serving: str) -> Mapping[str, Any] | None:
    """The engine's MPI launch for this serving mode, or None (one process per host)."""
    return (rules.get("mpi_world") or {}).get(serving)


def _slot(s: Service) -> int:
    return int(s.name.rsplit("@", 1)[1])


def _mounts(*files: str) -> list[str]:
    return [a for f in files for a in ("-v", f"{f}:{f}:ro")]


def _without_files(s: Service) -> list[str]:
    """Its docker args less the mounts of its own config files (a follower runs no engine, reads none)."""
    own = {f"{p}:{p}:ro" for p, _ in s.files}
    out, args = [], list(s.docker_args)
    for i, a in enumerate(args):
        if a in own and i and args[i - 1] == "-v":
            out.pop()
            continue
        out.append(a)
    return out


def launcher(s: Service, mpi: Mapping[str, Any], port: int, hosts: list[tuple[str, int]],
             followers: list[str]) -> Service:
    """Rank 0 of a multi-host worker (`s`: its rank's service as one process would run it) as the MPI world's
    launcher: mpirun over every rank (`hosts`: each rank's address and GPUs), after its `followers` ("host/unit")."""
    p = paths(_slot(s))
    # rank 0's plan env reaches every rank; its secrets (etcd/NATS passwords) only rank 0, which alone runs Dynamo
    forward = list(dict.fromkeys([*mpi["forward"], *(k for k, _ in s.env)]))
    launcher = (*mpi["mpirun"], "-np", str(sum(n for _, n in hosts)), "--hostfile", p["hosts"],
                "--mca", "plm_rsh_args", f"-F {p['ssh_config']}", *(a for k in forward for a in ("-x", k)),
                *mpi["wrap"])
    peers = [a for a, _ in hosts[1:]]
    ssh_config = "".join(f"Host {a}\n" for a in peers) + (
        f"    Port {port}\n    User root\n    IdentityFile {p['key']}\n    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {p['known_hosts']}\n    StrictHostKeyChecking yes\n    BatchMode yes\n"
        "    PasswordAuthentication no\n")
    known = "".join(f"[{a}]:{port} {{{HOST_KEY_PUB}}}\n" for a in peers)
    prov = Provenance("mpi:launch", " ".join(launcher), "plan:mpi-world", SOURCE)
    return replace(
        s, argv=launcher + s.argv,
        docker_args=s.docker_args + tuple(mpi["docker"]) + tuple(_mounts(p["hosts"], p["ssh_config"], p["key"],
                                                                          p["known_hosts"])),
        files=s.files + ((p["hosts"], "".join(f"{a} slots={n}\n" for a, n in hosts)), (p["ssh_config"], ssh_config)),
        secret_files=s.secret_files + ((p["key"], SSH_KEY), (p["known_hosts"], known)),
        after=s.after + tuple(followers), provenance=s.provenance + (prov,), mpi="launcher")


def follower(s: Service, mpi: Mapping[str, Any], port: int, address: str, master: str) -> Service:
    """A rank > 0 of a multi-host worker as an MPI follower: only an sshd in the same image (rank 0's mpirun starts
    its MPI ranks through it)."""
    p = paths(_slot(s))
    sshd_config = (f"Port {port}\nListenAddress {address}\nHostKey {p['host_key']}\n"
                   f"AuthorizedKeysFile {p['authorized_keys']}\nPermitRootLogin prohibit-password\nAllowUsers root\n"
                   "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                   "UsePAM no\nStrictModes yes\nX11Forwarding no\nAllowTcpForwarding no\nAllowAgentForwarding no\n"
                   "PermitTunnel no\nPrintMotd no\n")
    argv = (mpi["sshd"], "-D", "-e", "-f", p["sshd_config"])
    # sshd needs its privilege separation directory (/run/sshd); a tmpfs, so nothing is left in the image
    docker = _without_files(s) + list(mpi["docker"]) + ["--tmpfs", "/run/sshd:mode=0755"] + _mounts(
        p["sshd_config"], p["host_key"], p["authorized_keys"])
    return replace(
        s, argv=argv, env=(), secret_env=(), docker_args=tuple(docker), files=((p["sshd_config"], sshd_config),),
        # the client key, from rank 0's address only, with no pty or forwarding (orted needs neither)
        secret_files=((p["host_key"], HOST_KEY),
                      (p["authorized_keys"], f'restrict,from="{master}" {{{SSH_KEY_PUB}}}\n')),
        ports=(Port("mpi-ssh", port, address),),
        readiness=Readiness(kind="tcp", address=address, port=port, timeout_s=60), after=(),
        provenance=(Provenance("mpi:sshd", " ".join(argv), "plan:mpi-world", SOURCE),), mpi="follower")


def forwarded(s: Service, names) -> Service:
    """`s` with `names` (env added to its env file after the build: a host's facts) forwarded by its mpirun too,
    before the launcher's wrapper; any other service unchanged."""
    argv = list(s.argv)
    have = {argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-x"}
    new = [n for n in names if n not in have]
    if not new or not argv or not argv[0].endswith("/mpirun") or "-x" not in argv:
        return s
    at = len(argv) - argv[::-1].index("-x") + 1  # after the last `-x NAME`
    return replace(s, argv=tuple(argv[:at] + [a for n in new for a in ("-x", n)] + argv[at:]))
