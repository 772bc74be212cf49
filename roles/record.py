"""The deploy record: after everything else, each host reports what actually runs (m3deploy.facts.deployed:
container image ids and digests, driver, CUDA/ROCm, Dynamo, model repo commits) and the controller writes it
with the plan's services and how the host is reached (its non-secret ssh_* data, for `m3deploy prune`) into
~/.config/m3deploy/<cluster>/deployed.json (m3deploy.controller.deployed).

Runs when this run (re)started a service or the record's planned part differs from the plan (or lacks the host),
so a no-op re-run changes nothing. Reads host_plan() (services, weights_dir), cluster_plan() (name, venv,
model_repos).
"""
from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import python

from m3deploy.controller import deployed
from m3deploy.core.connection import sudo_args
from m3deploy.core.errors import M3Error
from m3deploy.deploy import context
from m3deploy.facts.deployed import parse_probe, probe_command
from roles import lifecycle


def _record(cp, hp):
    cmd = probe_command({s.name: s.image for s in hp.services if s.image},
                        [r.repo for r in cp.model_repos] if hp.weights_dir else [],
                        hub=f"{hp.weights_dir}/hub", venv=cp.venv if any(not s.image for s in hp.services) else "")
    ok, output = host.run_shell_command(cmd, **sudo_args(host.data))  # as the host's operations (`_sudo`)
    if not ok:
        raise M3Error(f"host {hp.name}: the deploy-record probe failed: {output.stderr[-300:]}")
    path = deployed.write_host(cp, hp, parse_probe(output.stdout), deployed.connection(host.data))
    host.log(f"recorded in {path}: {deployed.describe_running(deployed.load(cp.name)['hosts'][hp.name])}")


@deploy("Record the deployment")
def record_deployment():
    cp, hp = context.cluster_plan(), context.host_plan()
    if not hp.services and not hp.weights_dir:
        return
    entry = (deployed.load(cp.name).get("hosts") or {}).get(hp.name) or {}
    stale = (entry.get("planned") != deployed.planned(cp, hp)
             or entry.get("connect") != deployed.connection(host.data))  # how `m3deploy prune` reaches it
    python.call(name=f"Record what runs on the host ({deployed.record_path(cp.name)})", function=_record,
                cp=cp, hp=hp, _if=lambda: stale or lifecycle.started_anything())
