"""Engine workers: one systemd unit per worker rank on this host (m3-worker@<n>.service).

Reads (through m3deploy.deploy.context): cluster_plan() (name; the frontend service, to wait until it
lists this host's workers); host_plan().services of kind "worker": command (native venv argv for
the mocker, `docker run ...` for GPU engines), env, secret_env, env_file, workdir, readiness,
rank; kind "scripted" (the mocker cluster's tool-call engine) the same way. Mocker and scripted engines run
files/m3-sim-engine.py, shipped to m3deploy.core.simengine.SIM_ENGINE. Only the unit whose unit file or env file
(or that script) changed is restarted (`_if=op.did_change`).
Native workers run as system user m3; container workers as root (docker).
"""
from pyinfra.api import deploy
from pyinfra.operations import files, python

from m3deploy.check import readiness
from m3deploy.core.inputs import url_host
from m3deploy.core.simengine import SIM_ENGINE
from roles import _units as u


def _frontend_health(cp):
    for h in cp.hosts:
        for s in h.services:
            if s.kind == "frontend":
                for p in s.ports:
                    if p.name == "http":
                        return s, f"http://{url_host(p.address)}:{p.port}/health"
    return None, None


def _wait_registered(url, address, count, timeout_s):
    def mine():
        return [i for i in readiness.generate_instances(url)
                if str((i.get("transport") or {}).get("tcp", "")).startswith(f"{url_host(address)}:")]
    import time
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if len(mine()) >= count:
                return
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise readiness.NotReady(
                f"the frontend ({url}) does not list {count} `generate` instance(s) at {address} after "
                f"{timeout_s} s; fix: journalctl -u 'm3-worker@*' on that host, check ETCD_ENDPOINTS/"
                "NATS_SERVER and the DYN_*_HOST addresses in /etc/m3/*.env")
        time.sleep(0.5)


@deploy("Deploy the workers")
def deploy_workers():
    cp, hp = u.plans()
    workers = u.services(hp, "worker") + u.services(hp, "scripted")
    starts = []
    if any(not s.image for s in workers):
        u.ensure_m3_user()
    sim = []
    if any(SIM_ENGINE in s.argv for s in workers):  # the mocker and scripted engines (m3deploy.core.simengine)
        sim.append(files.put(name=f"Ship {SIM_ENGINE}", src=str(u.REPO / "files/m3-sim-engine.py"),
                             dest=SIM_ENGINE, user="root", group="root", mode="0755"))
    for s in workers:
        user = "root" if s.image else u.M3_USER
        u.ensure_workdir(s, user)
        unit_op, env_op = u.install_service(cp, s, "m3-worker@.service.j2", user)
        starts.append(u.start_or_restart(s, unit_op, [unit_op, env_op, *sim]))
    # all of this host's ranks start first, then the waits: engines load in parallel
    for s, started in zip(workers, starts):
        u.wait_ready(s, started)
    fe, url = _frontend_health(cp)
    heads = [s for s in workers if s.rank == 0]
    if fe is not None and cp.serving == "dynamo" and heads:
        timeout = max((s.readiness.timeout_s for s in heads if s.readiness), default=120)
        python.call(name=f"Wait until the frontend lists this host's {len(heads)} worker(s)",
                    function=_wait_registered, url=url, address=hp.address, count=len(heads),
                    timeout_s=timeout, _if=lambda: any(st() for st in starts))
