"""Ship Dynamo's wheelhouse, build the versioned venv OFFLINE, ship the mock model (mocker engine).

Reads (through m3deploy.deploy.context): cluster_plan().dynamo_version, .venv, .engine, .model_dir,
.served_model_name; host_plan().services (only hosts with a native frontend/worker get the venv;
only hosts with a mocker worker get the model dir).

The controller builds the wheelhouse once, before any host's work (m3deploy.deploy.context ->
m3deploy.controller.prepare; published under ~/.cache/m3deploy/wheelhouse/dynamo-<v>/<digest>/, `current` points at
it). On a host it lives in /opt/m3/wheelhouse/dynamo-<v>/; the host's copy is compared by one fact (sha256 of its
SHA256SUMS): when equal nothing is sent, else the whole wheelhouse goes as one archive (one transfer, not one
operation per wheel), which the host unpacks beside its copy, checks file by file against SHA256SUMS
(`sha256sum -c`) and only then swaps in. The venv is rebuilt only when its
stamp (`<venv>/.m3-wheelhouse`) differs from the manifest digest. Hosts need no internet and no
python3-venv package (`venv --without-pip`, pip bootstrapped from its own wheel).
"""
import shlex

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.server import Command
from pyinfra.operations import apt, server

from m3deploy.controller import artifacts, mockmodel, tinymodel
from m3deploy.core import catalog
from m3deploy.core.errors import M3Error
from m3deploy.deploy.hostfiles import STAMP, WHEELHOUSE_ROOT
from roles import hostops, lifecycle


def _remote_state(wheelhouse: str, venv: str) -> tuple[str, str]:
    """(sha256 of the host's SHA256SUMS or "none", the venv's stamp or "broken"), in one fact."""
    q, v = shlex.quote(f"{wheelhouse}/{artifacts.MANIFEST}"), shlex.quote(venv)
    out = host.get_fact(Command, command=f"if [ -f {q} ]; then sha256sum < {q} | cut -d' ' -f1; else echo none; fi; "
                                         f"if [ -x {v}/bin/python ] && [ -s {v}/{STAMP} ]; then head -n1 {v}/{STAMP}; "
                                         "else echo broken; fi") or ""
    lines = (out.splitlines() + ["none", "broken"])[:2]
    return lines[0].strip(), lines[1].strip()


@deploy("Ship Dynamo artifacts")
def deploy_artifacts():
    cp, hp = lifecycle.plans()
    native = [s for s in hp.services if s.kind in ("frontend", "worker") and not s.image]
    _ship_mock_model(cp, hp)
    if not native:
        host.noop("no native Dynamo process on this host: no venv needed")
        return
    if not cp.dynamo_version or not cp.venv:
        raise M3Error(f"host {hp.name} runs {[s.name for s in native]} natively but the plan has no "
                      "dynamo_version/venv (set m3_dynamo_version)")
    # built before any host's work (context); the planner's host's holds the planner's imports too
    target = artifacts.host_target(cp, hp)
    local = artifacts.ensure_wheelhouse(cp.dynamo_version, target=target)
    digest = artifacts.manifest_digest(local)
    reqs = artifacts.read_requirements(local)
    remote = f"{WHEELHOUSE_ROOT}/dynamo-{cp.dynamo_version}"

    have_wheelhouse, stamp = _remote_state(remote, cp.venv)
    if have_wheelhouse != digest:
        hostops.ship_wheelhouse(name=f"Ship the wheelhouse to {remote} (one archive, checked against "
                                     f"{artifacts.MANIFEST})", archive=str(artifacts.wheelhouse_archive(local)),
                                dest=remote)
    else:
        host.noop(f"wheelhouse {remote} matches the controller's ({digest[:12]})")

    cpu = catalog.cpu_build(cp.engine, hp.platform) if target.engine else None
    if cpu and cpu.get("packages"):  # the engine's CPU build: the Debian libraries its wheels link
        apt.packages(name=f"Install {', '.join(cpu['packages'])} ({cp.engine}'s CPU build)",
                     packages=list(cpu["packages"]), no_recommends=True, update=True, cache_time=3600,
                     **hostops.APT_RETRIES)
    venv = cp.venv
    if stamp != digest:
        cmds = artifacts.install_commands(cp.dynamo_version, remote, venv, requirements=reqs, lock=bool(target.engine))
        # an engine's CPU build: and engines.yaml `cpu: venv_check` runs
        check = "import dynamo.frontend, dynamo.mocker" + (f"; {cpu['venv_check']}" if (cpu or {}).get("venv_check")
                                                           else "")
        server.shell(name=f"Build {venv} offline from the wheelhouse", commands=[
            f"rm -rf {shlex.quote(venv)}", *cmds,
            f"{shlex.quote(venv)}/bin/python -c {shlex.quote(check)}",
            f"echo {digest} > {shlex.quote(venv)}/{STAMP}"])
    else:
        host.noop(f"{venv} is built from this wheelhouse")


def _ship_mock_model(cp, hp):
    """Mocker workers, native or in the stand-in image (mounted at the same path), read the mock model dir; an
    engine's CPU build (engines.yaml `cpu:`) the tiny random-weights model (m3deploy.controller.tinymodel)."""
    if any(s.kind == "worker" for s in hp.services) and catalog.cpu_build(cp.engine, hp.platform):
        model = tinymodel.ensure_model_dir(cp.served_model_name or tinymodel.NAME)
        hostops.put_dir(name=f"Ship the tiny model to {cp.model_dir}", src=str(model), dest=cp.model_dir,
                        names=tuple(tinymodel.FILES))
    if any(s.kind == "worker" for s in hp.services) and cp.engine == "mocker":
        if not cp.model_dir:
            raise M3Error("engine mocker needs the plan's model_dir (ClusterPlan.model_dir: "
                          "<m3_state_dir>/models/mock-minimax-m3)")
        model = mockmodel.ensure_model_dir(cp.served_model_name or mockmodel.NAME)
        hostops.put_dir(name=f"Ship the mock model to {cp.model_dir}", src=str(model), dest=cp.model_dir,
                  names=tuple(mockmodel.FILES))
