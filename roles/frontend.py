"""The Dynamo frontend (OpenAI HTTP + KV router), native from the versioned venv.

Reads (through m3deploy.deploy.context): cluster_plan().name; host_plan().services of kind "frontend":
argv/command, env (ETCD_ENDPOINTS, NATS_SERVER, DYN_* advertised addresses, HOME, ...),
secret_env (ETCD_AUTH_PASSWORD, NATS_AUTH_PASSWORD), env_file, workdir, readiness.
Runs as system user m3 (root only when the plan gives it a container image).
Needs deploy_artifacts() first (venv) and etcd/NATS ready.
"""
from pyinfra.api import deploy
from pyinfra.operations import files, systemd
from pyinfra.operations.util import any_changed

from roles import _units as u
from roles._render import render


@deploy("Deploy the Dynamo frontend")
def deploy_frontend():
    cp, hp = u.plans()
    for s in u.services(hp, "frontend"):
        user = "root" if s.image else u.M3_USER
        if not s.image:
            u.ensure_m3_user()
        u.ensure_workdir(s, user)
        unit_op, env_op = u.install_service(cp, s, "m3-frontend.service.j2", user)
        started = u.start_or_restart(s, unit_op, [unit_op, env_op])
        u.wait_ready(s, started)
        if s.readiness and s.readiness.kind == "http":
            _watchdog(cp, s)


WATCHDOG = "/usr/local/lib/m3/m3-watchdog.py"
WATCHDOG_UNIT = "m3-frontend-watchdog.service"
WATCHDOG_GRACE_S = 15  # the frontend answers /live ~1 s after a start; a restart while etcd is away is harmless


def _watchdog(cp, s):
    """m3-frontend-watchdog.service restarts the frontend when its /live stops answering while the unit is active:
    after losing its etcd lease the frontend can hang in shutdown instead of exiting (files/m3-watchdog.py)."""
    script = files.put(name=f"Ship {WATCHDOG}", src=str(u.REPO / "files/m3-watchdog.py"), dest=WATCHDOG,
                       user="root", group="root", mode="0755")
    unit = u.put_text(name=f"Render {u.UNIT_DIR}/{WATCHDOG_UNIT}", dest=f"{u.UNIT_DIR}/{WATCHDOG_UNIT}",
                      text=render("m3-watchdog.service.j2", cluster=cp.name, unit=s.unit, url=s.readiness.url,
                                  script=WATCHDOG, grace_s=WATCHDOG_GRACE_S))
    systemd.daemon_reload(name=f"Reload systemd ({WATCHDOG_UNIT} changed)", _if=unit.did_change)
    changed = any_changed(script, unit)
    systemd.service(name=f"Restart {WATCHDOG_UNIT} (its files changed)", service=WATCHDOG_UNIT, running=True,
                    restarted=True, enabled=True, _if=changed)
    u.ensure_started(name=f"Start {WATCHDOG_UNIT}", unit=WATCHDOG_UNIT, _if=lambda: not changed())
