"""The plan inside a pyinfra run: built once per run from pyinfra's inventory, then read by every role.

Roles call `host_plan()` (the current host's part) or `cluster_plan()`; nothing else decides anything.
"""
from __future__ import annotations

import threading

import click
from pyinfra import host, state
from pyinfra.api.exceptions import PyinfraError
from pyinfra_cli.exceptions import CliError

from m3deploy.controller import deployed, user_tls
from m3deploy.core import build as planmod
from m3deploy.core.errors import ValidationError
from m3deploy.core.inventory import InvHost, unmatched_group_data
from m3deploy.core.model import ClusterPlan, HostPlan
from m3deploy.deploy import factbatch, pyinfra_speed

_CACHE_ATTR = "_m3deploy_plan"
_INVENTORY_ATTR = "_m3deploy_inventory_file"
_build_lock = threading.Lock()  # cooperative under pyinfra (gevent.monkey.patch_all)


class DeployStopped(CliError, PyinfraError):
    """m3deploy stops the deploy: pyinfra's CLI passes its own (CliError) exceptions through unwrapped and click
    exits with their exit_code; PyinfraError makes pyinfra's per-host loader and exec_file re-raise it as is."""

    exit_code = 2

    def show(self, file=None):
        click.echo(f"--> {click.style('m3deploy', 'red', bold=True)}: {self.message}", err=True)


class InvalidPlan(DeployStopped):
    """The inventory or the plan is refused, or the controller cannot prepare the deploy: no host was changed."""


class HostsFailed(DeployStopped):
    """A host cannot be reached, or failed an operation (roles/failfast.py): the deploy stops there."""


def plan_name(pyinfra_host) -> str:
    """The plan's name for a pyinfra host: its inventory name."""
    return pyinfra_host.name


def pyinfra_host(name: str):
    """The pyinfra host the plan calls `name` (roles acting on another host: facts, connections)."""
    return next(h for h in state.inventory if plan_name(h) == name)


def hosts_from_pyinfra(inv) -> list[InvHost]:
    """pyinfra's Inventory as the plan reads it: name, groups, merged data per host."""
    out = []
    for h in inv:
        groups = tuple(g.name if hasattr(g, "name") else str(g) for g in getattr(h, "groups", ()))
        out.append(InvHost(name=plan_name(h), groups=groups, data=h.data.dict()))
    return out


def record_inventory_file(path: str) -> None:
    """Note the inventory file named on pyinfra's command line (m3deploy.deploy.preload, run from config.py before
    pyinfra loads it). pyinfra keeps no note of it; its State lives for the whole run."""
    setattr(state, _INVENTORY_ATTR, path)


def inventory_file() -> str | None:
    """The inventory file of this run; None when pyinfra was not started from its CLI with an inventory file
    (the API, a host list). The plan names the cluster after it unless m3_cluster is set."""
    return getattr(state, _INVENTORY_ATTR, None)


def cluster_plan() -> ClusterPlan:
    """The validated plan for this pyinfra run (raises ValidationError with every problem).

    The first host's greenlet builds it and then every controller artifact the deploy needs
    (m3deploy.controller.prepare: wheelhouses, mock model, secrets, image archives), once, while the other hosts'
    greenlets wait on the lock (pyinfra loads deploy.py for every host at once): nothing is built lazily
    inside one host's operations, and an artifact that cannot be had stops the run before any host changes.
    Then every host's facts are batched into one round (m3deploy.deploy.factbatch)."""
    cached = getattr(state, _CACHE_ATTR, None)
    if cached is not None:
        return cached
    with _build_lock:
        cached = getattr(state, _CACHE_ATTR, None)
        if cached is None:
            hosts = hosts_from_pyinfra(state.inventory)
            try:
                cached = planmod.build(hosts, name=inventory_file())  # the cluster's name: m3_cluster, else the file's
            except ValidationError as e:  # a misnamed group_data file is the likely cause of a missing key: name it
                raise ValidationError(e.problems + (unmatched_group_data(inventory_file()) if inventory_file()
                                                    else [])) from None
            deployed.refuse_skew(cached)  # a version skew catalog.yaml forbids: ValidationError, before any host
            tls_problems = user_tls.problems(hosts) if cached.state != "absent" else []  # the user's edge cert/key/CA
            if tls_problems:
                raise ValidationError(tls_problems)
            if cached.state != "absent":
                _prepare_controller(cached)
            _warn_unmanaged(cached)
            # every host's facts in one round (what the last such run asked), before any host is asked one
            factbatch.install(state, f"{cached.name}/fact-rounds-{cached.state}")
            pyinfra_speed.install()  # pyinfra's per-operation costs that compute nothing (module docstring)
            setattr(state, _CACHE_ATTR, cached)
    return cached


def _warn_unmanaged(plan: ClusterPlan) -> None:
    """The deploy record's hosts that the inventory no longer names are never touched by a deploy: say so, once,
    with the `m3deploy prune` command that drains and removes them (m3deploy.controller.prune)."""
    from m3deploy.controller import deployed, prune

    msg = prune.warning(plan, deployed.load(plan.name), inventory_file() or "INVENTORY")
    if msg:
        click.echo(f"--> {click.style('m3deploy', 'yellow', bold=True)}: warning: {msg}", err=True)


def _prepare_controller(plan: ClusterPlan) -> None:
    from m3deploy.controller import certs, prepare, secrets, tls

    def say(msg: str) -> None:
        if not msg.startswith("$ "):  # pip's command lines stay out of pyinfra's output
            print(f"    [controller] {msg}", flush=True)

    secrets.api_key(plan)  # m3_api_key_file readable, 0600, one line: else stop before any host
    for note in certs.renew(plan):  # what is inside m3_cert_renew_days re-issued, the CA's rotation step
        say(note)
    tls.trust(plan)  # the edge's certificate made (or the user's read) and trusted, before any host
    if plan.endpoint.startswith("https://"):
        tls.edge_pem(plan)
    prepare.ensure_all(plan, log=say)
    secrets.ensure_secrets(plan.name)


def host_plan() -> HostPlan:
    """The current host's part of the plan. For a GPU host in a multi-host worker, the networking env
    (NCCL/GLOO socket interface, NCCL_IB_HCA, UCX_NET_DEVICES) is completed from this host's live facts
    wherever the recipe or the user did not set it (provenance "facts"): overlaid onto the one plan, which is
    not rebuilt."""
    name = plan_name(host)
    hp = cluster_plan().host(name)
    if not hp.needs_rdma:
        return hp
    key = f"{_CACHE_ATTR}_{name}"
    cached = getattr(state, key, None)
    if cached is None:
        from m3deploy.core.netenv import env_from_facts
        from m3deploy.facts import DefaultRouteInterface, RdmaDevices

        facts = {"default_interface": host.get_fact(DefaultRouteInterface), "rdma": host.get_fact(RdmaDevices)}
        cached = planmod.with_fact_env(cluster_plan(), hp, env_from_facts(facts))
        setattr(state, key, cached)
    return cached
