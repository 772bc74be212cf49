"""Engine workers: one systemd unit per worker rank on this host (m3-worker@<n>.service).

Reads (through m3deploy.deploy.context): cluster_plan() (name; the frontend service, to wait until it
lists this host's workers); host_plan().services of kind "worker": command (native venv argv for
the mocker, `docker run ...` for GPU engines), env, secret_env, env_file, workdir, readiness,
rank; kind "scripted" (the mocker cluster's tool-call engine) the same way. Mocker and scripted engines run
files/m3-sim-engine.py, shipped to m3deploy.core.simengine.SIM_ENGINE. cluster_plan().rollout (m3_rollout,
m3_rollout_max_unavailable): only the units whose unit file or env file (or that script) changed are restarted:
one engine instance at a time by roles/_rollout.py (m3_rollout="rolling", the default), or here, per host, all
at once (`_if=op.did_change`, m3_rollout="all-at-once"). A container worker also restarts when roles/images.py put a
new image under its image's name on the host in this run (`image_changed`).
Native workers run as system user m3; container workers as root (docker). Dynamo workers' units revoke the
discovery records a killed process of theirs left (ExecStopPost, files/m3-unregister-dead.py, shipped here).
"""
from pyinfra.api import deploy
from pyinfra.operations import python

from m3deploy.check import rollout
from m3deploy.check.checks import frontend_url, metrics_url
from m3deploy.core import internal_tls
from m3deploy.core.simengine import SIM_ENGINE
from m3deploy.deploy import hostfiles
from roles import _rollout
from roles import _units as u
from roles.images import image_changed


def _wait_registered(cp, heads, timeout_s):
    """The frontend lists this host's workers under the ids of their running processes (not stale entries)."""
    rollout.wait_workers(frontend_url(cp, "/health"), {f"{s.host}/{s.name}": metrics_url(cp.host(s.host), s)
                                                       for s in heads}, timeout_s=timeout_s)


@deploy("Deploy the workers")
def deploy_workers():
    cp, hp = u.plans()
    workers = u.services(hp, "worker") + u.services(hp, "scripted")
    starts = []
    rolling = cp.rollout.mode == "rolling"
    if any(not s.image for s in workers):
        u.ensure_m3_user()
    sim = []
    if any(hostfiles.uses_sim_engine(s) for s in workers):  # native mocker/scripted engines (core.simengine); in a
        sim.append(u.ship(hostfiles.sim_engine(), name=f"Ship {SIM_ENGINE}"))  # container the stand-in image holds it
    if any(internal_tls.launcher(s) for s in workers):  # m3_internal_tls: ExecStart starts with it
        sim.append(u.ship(hostfiles.tls_launcher(), name=f"Ship {internal_tls.LAUNCHER}"))
    if any(hostfiles.unregisters_dead(s) for s in workers):  # read by the units' ExecStopPost: no restart on change
        u.ship(hostfiles.unregister_script(), name=f"Ship {hostfiles.UNREGISTER_DEAD}")
    for s in workers:
        u.ensure_workdir(s, hostfiles.service_user(s))
        # the config files its command names (TensorRT-LLM's engine YAML; an MPI world's hostfile, ssh configs and
        # 0600 keys): a change restarts it
        cfg = [u.ship(f, name=f"Ship {f.path}") for f in hostfiles.config_files(s, u.secrets_for(cp))]
        unit_op, env_op = u.install_service(cp, s, keep=s.kind == "worker")
        if s.standby:  # m3_planner: installed, never enabled or started here; the actuator's agent runs it
            u.stage(s.unit, unit_op, u.changes(s, unit_op, env_op, *cfg, *sim))
            continue
        # a new image under the same name (a moved tag, a rebuilt stand-in) restarts the workers that run it
        changed = u.changes(s, unit_op, env_op, *cfg, *sim, *filter(None, [s.image and image_changed(s.image)]))
        # engine instances of the plan (cp.workers) are restarted in turn by roles/_rollout.py, after every host
        # has its files; the scripted test engine is no planned worker and restarts here
        roll = rolling and s.kind == "worker"
        if roll:
            _rollout.register(s, lambda ops=tuple(changed): any(u._did_change(op) for op in ops))
        starts.append(u.activate(s.unit, unit_op, changed, rolled=roll))
    # all of this host's ranks start first, then the waits: engines load in parallel
    workers = [s for s in workers if not s.standby]
    for s, started in zip(workers, starts):
        u.wait_ready(s, started)
    # the ones started here; engine instances left to the rollout are waited for by roles/_rollout.py
    heads = [s for s in workers if s.rank == 0 and metrics_url(hp, s) and not (rolling and s.kind == "worker")]
    if cp.serving == "dynamo" and heads:
        timeout = max((s.readiness.timeout_s for s in heads if s.readiness), default=120)
        python.call(name=f"Wait until the frontend lists this host's {len(heads)} worker(s)",
                    function=_wait_registered, cp=cp, heads=heads, timeout_s=timeout,
                    _if=lambda: any(st() for st in starts))
