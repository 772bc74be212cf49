"""deploy.py with 3 control hosts (the shipped gb200 inventory with two more control hosts), on pyinfra's `@fake`
connector as in test_deploy_py.py: a 3-member etcd and a 3-node NATS cluster, every Dynamo process given every
etcd endpoint; with 1 control host nothing of this appears (the shipped inventories' plan snapshots and
test_deploy_py.py cover that). Contracts: etcd's clustering flags (etcd 3.4 `--initial-cluster`,
`--initial-cluster-state`, `--initial-cluster-token`); nats-server 2.9 cluster `routes` (a route URL without
credentials is refused by a node with cluster authorization: measured on the testbed, docs/OPERATIONS.md);
Dynamo 1.6.1 splits ETCD_ENDPOINTS on ',' (ai-dynamo/dynamo lib/runtime/src/transports/etcd.rs
default_servers) and passes NATS_SERVER to async-nats as one address (lib/runtime/src/transports/nats.rs,
async-nats `impl ToServerAddrs for str`)."""
from __future__ import annotations

from pathlib import Path

import pytest
from test_deploy_py import (  # noqa: F401
    ROOT,
    Cluster,
    assert_no_secret_leak,
    assert_role_order,
    changing,
    controller,
    dynamo_ready,
    op,
    short,
)

from m3deploy.controller.secrets import load_secrets, public_pem
from m3deploy.core import build as planmod
from m3deploy.core import inventory

CONTROL = [("gb200-ctl-01", "10.20.0.10"), ("gb200-ctl-02", "10.20.0.11"), ("gb200-ctl-03", "10.20.0.12")]


class HACluster(Cluster):
    def __init__(self, tmp: Path):
        src = (ROOT / "inventories" / "gb200.py").read_text()
        ctl = "".join(f'    ("{n}", {{"ssh_hostname": "{a}", "m3_address": "{a}"}}),\n' for n, a in CONTROL)
        text = src.replace('    ("gb200-ctl-01", {"ssh_hostname": "10.20.0.10", "m3_address": "10.20.0.10"}),\n', ctl)
        assert text != src
        (tmp / "inventories").mkdir()
        (tmp / "inventories" / "gb200.py").write_text(text)
        (tmp / "group_data").symlink_to(ROOT / "group_data")
        self.inv, self.override_data = "gb200", {"m3_serving": "dynamo"}
        self.hosts = inventory.load_inventory(tmp / "inventories" / "gb200.py", override_data=self.override_data)
        self.plan = planmod.build(self.hosts, name="gb200")
        self.groups = {"control": [], "workers": [], "gb200": []}
        for h in self.hosts:
            for g in h.groups:
                self.groups.setdefault(g, []).append(h.name)


@pytest.fixture
def ha(tmp_path, dynamo_ready):
    c = HACluster(tmp_path)
    return c, c.run(state="fresh")


def uploaded(ops, dest: str) -> str:
    return next(o.uploads[dest] for o in ops if dest in o.uploads)


def test_three_control_hosts_run_etcd_and_nats_clusters(ha, controller):
    cluster, run = ha
    assert run.error is None, run.error
    assert_role_order(run, cluster)
    assert_no_secret_leak(run, controller)
    store = load_secrets("gb200")
    peers = ",".join(f"{n}=http://{a}:2380" for n, a in CONTROL)
    for i, (name, addr) in enumerate(CONTROL):
        ops = run.for_host(name)
        etcd_unit = uploaded(ops, "/etc/systemd/system/etcd.service")
        assert f"--initial-cluster {peers}" in etcd_unit and "--initial-cluster-state new" in etcd_unit
        assert "--initial-cluster-token m3-gb200" in etcd_unit
        assert f"--listen-peer-urls http://{addr}:2380" in etcd_unit
        # one JWT key pair for all members (each verifies the others' tokens), from the controller's store
        assert uploaded(ops, "/var/lib/m3/etcd/jwt.key") == store["etcd-jwt-key"]
        assert uploaded(ops, "/var/lib/m3/etcd/jwt.pub") == public_pem(store["etcd-jwt-key"])
        key_op = op(ops, "Render etcd's shared JWT signing key /var/lib/m3/etcd/jwt.key")
        assert "chmod 0600 /var/lib/m3/etcd/jwt.key" in key_op.commands[-1] and "etcd:etcd" in key_op.commands[-1]
        # auth is cluster-wide data: only the first member turns it on
        has_auth = "ExecStartPost=/usr/bin/python3 /usr/local/lib/m3/m3-etcd-auth.py" in etcd_unit
        assert has_auth == (i == 0), name
        assert ("M3_ETCD_ROOT_PASSWORD" in uploaded(ops, "/etc/m3/etcd.env")) == (i == 0), name
        # NATS: one node of a cluster, routes to the two others from the 0600 env file
        conf = uploaded(ops, "/etc/m3/nats.conf")
        assert f"server_name: {name}" in conf and "name: m3-gb200" in conf and f"listen: {addr}:6222" in conf
        assert "$M3_NATS_ROUTE_0" in conf and "$M3_NATS_ROUTE_1" in conf and "M3_NATS_ROUTE_2" not in conf
        assert store["nats-password"] not in conf
        env = uploaded(ops, "/etc/m3/nats.env")
        routes = sorted(ln.split("=", 1)[1] for ln in env.splitlines() if ln.startswith("M3_NATS_ROUTE_"))
        assert routes == sorted(f"nats-route://m3:{store['nats-password']}@{a}:6222" for n, a in CONTROL if n != name)
        env_op = op(ops, "Render /etc/m3/nats.env")
        assert any("chmod 0600 /etc/m3/nats.env" in c and "touch" in c for c in env_op.commands)
        # a frontend on each control host: every etcd endpoint, its own NATS as the seed
        fe = uploaded(ops, "/etc/m3/m3-frontend.env")
        assert f"ETCD_ENDPOINTS={','.join(f'http://{a}:2379' for _, a in CONTROL)}" in fe.splitlines()
        assert f"NATS_SERVER=nats://{addr}:4222" in fe.splitlines()
    for w in cluster.groups["workers"]:
        env = uploaded(run.for_host(w), "/etc/m3/m3-worker@0.env")
        assert f"ETCD_ENDPOINTS={','.join(f'http://{a}:2379' for _, a in CONTROL)}" in env.splitlines()
        assert f"NATS_SERVER=nats://{CONTROL[0][1]}:4222" in env.splitlines()


def test_a_changed_worker_keeps_its_previous_unit_and_env(ha):
    """The rollback copies: before a worker's unit or env file is rewritten, the old one goes to
    /var/lib/m3/rollback (0600 root); nothing is copied when nothing changes or on a first deploy."""
    from roles.hostops import PathState

    cluster, _ = ha
    w = cluster.groups["workers"][0]
    old = {"/etc/m3/m3-worker@0.env": "600:root:root:" + "0" * 64,
           "/etc/systemd/system/m3-worker@0.service": "644:root:root:" + "1" * 64}
    run = cluster.run(facts={w: {PathState: lambda path: old.get(path, "-")}})
    keep = op(run.for_host(w), "Keep the previous m3-worker@0.service and /etc/m3/m3-worker@0.env in /var/lib/m3/rollback")
    assert keep.commands == [f"install -d -m 0700 -o root -g root /var/lib/m3/rollback && install -m 0600 -o root "
                             f"-g root {p} /var/lib/m3/rollback/" for p in old]
    fresh = cluster.run(facts={w: {PathState: lambda path: "-"}})  # a first deploy: nothing to keep
    assert not op(fresh.for_host(w), "Keep the previous m3-worker@0.service and /etc/m3/m3-worker@0.env in "
                                     "/var/lib/m3/rollback").commands


def test_a_unit_left_running_older_files_restarts_on_the_rerun(ha):
    """A re-run whose files are already right still restarts a unit whose process is older than them (a run
    cut off between writing and restarting: a host lost mid-deploy, a stopped rollout)."""
    from roles.lifecycle import RunsOlderFiles

    cluster, _ = ha
    w = cluster.groups["workers"][0]
    run = cluster.run(facts={w: {RunsOlderFiles: lambda unit, paths: "stale" if unit == "m3-worker@0.service"
                                 else "ok"}})
    check = op(run.for_host(w), "Check m3-worker@0.service runs its current files")
    assert check.commands and "restarting it" in check.commands[0]
    assert not [o for o in changing(run.for_host(cluster.groups["control"][0])) if o.name.startswith("Deploy etcd | Check")]


def test_a_host_whose_files_are_right_gets_no_restart_or_reload_op(ha):
    """A no-change re-run: every file of a worker host already right (PathState, the one fact put_text asks) ->
    its services get only "Start <unit>" (roles/lifecycle.activate): no daemon-reload, restart or enable op is made,
    since none would run a command (pyinfra's cost of a re-run is per operation). A changed env file on the same
    host still makes its restart path."""
    import hashlib

    from m3deploy import facts
    from m3deploy.deploy import hostfiles
    from m3deploy.facts.parse import parse_docker_image
    from roles.cluster_secrets import secrets_for
    from roles.hostops import PathState, mode_digits

    cluster, first = ha
    w = cluster.groups["workers"][0]
    hp = next(h for h in cluster.plan.hosts if h.name == w)
    sent = {d: t for o in first.for_host(w) for d, t in o.uploads.items()}  # as the first run rendered them (facts)
    right = {f.path: f"{mode_digits(f.mode)}:{f.user}:{f.group}:{hashlib.sha256(sent[f.path].encode()).hexdigest()}"
             for f in hostfiles.host_files(cluster.plan, hp, secrets_for(cluster.plan)) if f.path in sent}
    image = {facts.DockerImage: lambda image: parse_docker_image("sha256:" + "a" * 64 + " ")}  # its engine image there
    run = cluster.run(facts={w: {PathState: lambda path: right.get(path, "-"), **image}})
    assert run.error is None, run.error
    names = [short(o, w) for o in run.for_host(w)]
    units = [s.unit for s in hp.services if s.kind == "worker"]
    assert units and all(f"Start {u}" in names for u in units), names
    assert not [n for n in names if n.startswith(("Reload systemd", "Restart ", "Enable "))], names
    env = next(f for f in right if f.endswith("m3-worker@0.env"))
    changed = cluster.run(facts={w: {PathState: lambda path: "600:root:root:" + "0" * 64 if path == env
                                     else right.get(path, "-"), **image}})
    names = [short(o, w) for o in changed.for_host(w)]
    assert "Enable m3-worker@0.service (the rollout restarts it)" in names, names
