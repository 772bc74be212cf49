"""Scale in, asked for explicitly: `m3deploy prune INVENTORY [--host H ...] [--yes]` (m3deploy/cli/prune.py).

A host that the deploy record (m3deploy.controller.deployed) lists but the inventory no longer names is a prune
*candidate*. A plain deploy never touches it (m3deploy.deploy.context warns, naming it and this command), so a
typo in an inventory cannot tear a host down. `plan()` decides what `prune` would remove, and refuses (M3Error,
nothing changed) when:

- the record lists no host (nothing deployed for this cluster);
- the inventory and the record share no host: the wrong inventory, or another cluster's record;
- a host the inventory names is not deployed yet: deploy first, so that what stays is serving before anything
  goes;
- what stays would have no control host (Dynamo: etcd, NATS, the frontend) or no worker;
- a candidate is a control host (it runs etcd or NATS): going from 3 control hosts to 1 is not automated;
- a candidate is reached at the address of a host the inventory names (a host renamed, or its name mistyped: the
  host behind that address is the inventory's now);
- `--host` names a host that is not a candidate (still in the inventory, or not in the record);
- the record has no connection data for a candidate (deployed before the record kept it).

The teardown itself is the repository's prune.py run by pyinfra with an inventory of the candidates made from
their recorded connection data (`inventory_text`): drain, then the host's own manifest (roles/teardown.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from m3deploy.core.errors import M3Error
from m3deploy.core.model import ClusterPlan

GROUP = "pruned"  # the group of the inventory prune.py runs with


@dataclass(frozen=True)
class Target:
    name: str
    connect: dict  # deployed.CONNECT_KEYS from the record
    services: tuple[str, ...]  # what the record says it runs
    at: str  # when it was last recorded
    address: str  # its cluster address (where its workers registered)


def candidates(plan: ClusterPlan, record: dict) -> list[str]:
    """Hosts in the record that the plan does not name, sorted."""
    names = {h.name for h in plan.hosts}
    return sorted(n for n in (record.get("hosts") or {}) if n not in names)


def warning(plan: ClusterPlan, record: dict, inventory: str) -> str:
    """What a deploy says about the record's hosts it leaves alone ('' when none)."""
    gone = candidates(plan, record)
    if not gone:
        return ""
    hosts = " ".join(f"--host {n}" for n in gone)
    return (f"{', '.join(gone)}: in the deploy record of cluster {plan.name} but not in the inventory; this deploy "
            f"does not touch {'them' if len(gone) > 1 else 'it'} (still running, unmanaged). To drain and tear "
            f"down: `m3deploy prune {inventory} {hosts}` (lists what it removes; --yes does it). If the host was "
            "left out by mistake, put it back in the inventory.")


def _reach(h) -> str:
    return str(h.get("ssh_hostname") or "")


def plan(cp: ClusterPlan, record: dict, inventory_hosts, only=()) -> list[Target]:
    """The hosts `prune` removes, or M3Error naming why nothing may be removed. `inventory_hosts`: the
    inventory's hosts (m3deploy.core.inventory.InvHost: their ssh_hostname)."""
    hosts = record.get("hosts") or {}
    if not hosts:
        raise M3Error(f"cluster {cp.name}: the deploy record lists no host, nothing to prune")
    planned = [h.name for h in cp.hosts]
    if not set(planned) & hosts.keys():
        raise M3Error(f"the inventory and the deploy record of cluster {cp.name} share no host (inventory: "
                      f"{', '.join(planned)}; record: {', '.join(sorted(hosts))}): the wrong inventory, or another "
                      "cluster's record? Nothing was changed. Fix: give the cluster's own inventory (m3_cluster, "
                      "else the inventory file's name, names the record)")
    undeployed = [n for n in planned if n not in hosts]
    if undeployed:
        raise M3Error(f"{', '.join(undeployed)}: in the inventory but not deployed yet. Nothing was changed. Fix: run "
                      "the deploy first (the hosts that stay must serve before any host goes), then prune")
    if cp.serving == "dynamo" and not cp.group("control"):
        raise M3Error(f"cluster {cp.name}: no control host would be left. Nothing was changed")
    if not cp.workers:
        raise M3Error(f"cluster {cp.name}: no worker would be left. Nothing was changed")
    gone = candidates(cp, record)
    unknown = [n for n in only if n not in gone]
    if unknown:
        why = [f"{n} is {'still in the inventory (remove it there first)' if n in planned else 'not in the record'}"
               for n in unknown]
        raise M3Error(f"{'; '.join(why)}. Nothing was changed. Prune candidates: {', '.join(gone) or 'none'}")
    chosen = [n for n in gone if not only or n in only]
    addresses = {}
    for h in inventory_hosts:
        for a in {h.data.get("ssh_hostname") or h.name, h.data.get("m3_address") or ""} - {""}:
            addresses[str(a)] = h.name
    out = []
    for n in chosen:
        entry = hosts[n]
        connect = entry.get("connect") or {}
        if not connect.get("ssh_hostname"):
            raise M3Error(f"{n}: the deploy record has no connection data for it (deployed before the record kept "
                          "it). Nothing was changed. Fix: put it back in the inventory, deploy once, remove it, "
                          "then prune")
        control = sorted({"etcd", "nats"} & set((entry.get("planned") or {}).get("services") or {}))
        if control:
            raise M3Error(f"{n} is a control host (it runs {', '.join(control)}): removing a control host is not "
                          "automated (its etcd member and NATS route stay in the others' configuration). Nothing "
                          "was changed. See docs/OPERATIONS.md \"Scale in\"")
        same = addresses.get(_reach(connect))
        if same:
            raise M3Error(f"{n} was reached at {_reach(connect)}, the address of {same} in the inventory: renamed or "
                          f"mistyped? Pruning it would tear down {same}. Nothing was changed. Fix: give the host its "
                          "recorded name back, or remove it from the record by hand")
        out.append(Target(n, dict(connect), tuple(sorted((entry.get("planned") or {}).get("services") or {})),
                          str(entry.get("at", "?")), str(entry.get("address") or connect["ssh_hostname"])))
    return out


def inventory_text(targets: list[Target]) -> str:
    """A pyinfra inventory of the targets (Python literals only: repr of recorded strings, ints and bools)."""
    rows = "".join(f"    ({t.name!r}, {t.connect!r}),\n" for t in targets)
    return f'"""Written by `m3deploy prune`: the hosts it tears down (prune.py)."""\n{GROUP} = [\n{rows}]\n'
