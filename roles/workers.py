"""Engine workers: one systemd unit per worker rank on this host (m3-worker@<n>.service).

Reads (through m3deploy.deploy.context): cluster_plan() (name; the frontend service, to wait until it
lists this host's workers); host_plan().services of kind "worker": command (native venv argv for
the mocker, `docker run ...` for GPU engines), env, secret_env, env_file, workdir, readiness,
rank; kind "scripted" (the mocker cluster's tool-call engine) the same way. Mocker and scripted engines run
files/m3-sim-engine.py, shipped to m3deploy.core.simengine.SIM_ENGINE. cluster_plan().rollout (m3_rollout,
m3_rollout_max_unavailable): only the units whose unit file or env file (or that script) changed are restarted:
one engine instance at a time by roles/rolling.py (m3_rollout="rolling", the default), or here, per host, all
at once (`_if=op.did_change`, m3_rollout="all-at-once"). A container worker also restarts when roles/images.py put a
new image under its image's name on the host in this run (`image_changed`).
Native workers run as system user m3; container workers as root (docker). Dynamo workers' units revoke the
discovery records a killed process of theirs left (ExecStopPost, files/m3-unregister-dead.py, shipped here).
"""
from pyinfra.api import deploy
from pyinfra.operations import python

from m3deploy.check import rollout
from m3deploy.check.checks import frontend_url, metrics_url
from m3deploy.core import components
from m3deploy.deploy import hostfiles
from roles import lifecycle, rolling
from roles.images import image_changed


def _wait_registered(cp, heads, timeout_s):
    """The frontend lists this host's workers under the ids of their running processes (not stale entries)."""
    rollout.wait_workers(frontend_url(cp, "/health"), {f"{s.host}/{s.name}": metrics_url(cp.host(s.host), s)
                                                       for s in heads}, timeout_s=timeout_s)


@deploy("Deploy the workers")
def deploy_workers():
    cp, hp = lifecycle.plans()
    workers = lifecycle.role_services(hp, __name__)  # worker, scripted (m3deploy.core.components)
    starts = []
    in_turn = cp.rollout.mode == "rolling"

    def rolled(s):  # restarted in turn by roles/rolling.py, after every host has its files
        return in_turn and components.get(s.kind).lifecycle.activate == components.ROLLED

    if any(not s.image for s in workers):
        lifecycle.ensure_m3_user()
    sim = []
    if any(hostfiles.needs(s, components.SIM_ENGINE) for s in workers):  # native mocker/scripted engines; in a
        sim.append(lifecycle.ship_script(components.SIM_ENGINE))  # container the stand-in image holds it
    if any(hostfiles.needs(s, components.TLS_LAUNCHER) for s in workers):  # m3_internal_tls: ExecStart starts with it
        sim.append(lifecycle.ship_script(components.TLS_LAUNCHER))
    if any(hostfiles.needs(s, components.UNREGISTER_DEAD) for s in workers):  # read by ExecStopPost: no restart
        lifecycle.ship_script(components.UNREGISTER_DEAD)
    for s in workers:
        c = components.get(s.kind)
        lifecycle.ensure_workdir(s, hostfiles.service_user(s))
        # the config files its command names (TensorRT-LLM's engine YAML; an MPI world's hostfile, ssh configs and
        # 0600 keys): a change restarts it
        cfg = lifecycle.ship_config_files(cp, s)
        unit_op, env_op = lifecycle.install_service(cp, s, keep=c.lifecycle.keep_previous)
        if s.standby and c.lifecycle.standby == components.STAGED:  # m3_planner: the actuator's agent runs it
            lifecycle.stage(s.unit, unit_op, lifecycle.changes(s, unit_op, env_op, *cfg, *sim))
            continue
        # a new image under the same name (a moved tag, a rebuilt stand-in) restarts the workers that run it
        changed = lifecycle.changes(s, unit_op, env_op, *cfg, *sim, *filter(None, [s.image and image_changed(s.image)]))
        # engine instances of the plan (cp.workers) roll; the scripted test engine is no planned worker and restarts
        # here
        if rolled(s):
            rolling.register(s, lambda ops=tuple(changed): any(lifecycle.did_change(op) for op in ops))
        starts.append(lifecycle.activate(s.unit, unit_op, changed, rolled=rolled(s)))
    # all of this host's ranks start first, then the waits: engines load in parallel
    workers = [s for s in workers if not s.standby]
    for s, started in zip(workers, starts):
        lifecycle.wait_ready(s, started)
    # the ones started here; engine instances left to the rollout are waited for by roles/rolling.py
    heads = [s for s in workers if s.rank == 0 and metrics_url(hp, s) and not rolled(s)]
    if cp.serving == "dynamo" and heads:
        timeout = max((s.readiness.timeout_s for s in heads if s.readiness), default=120)
        python.call(name=f"Wait until the frontend lists this host's {len(heads)} worker(s)",
                    function=_wait_registered, cp=cp, heads=heads, timeout_s=timeout,
                    _if=lambda: any(st() for st in starts))
