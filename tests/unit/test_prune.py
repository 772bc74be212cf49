"""Scale in (issue 27): `m3deploy prune`'s planning and guards (m3deploy.controller.prune), the deploy record's
connection data, the deploy's warning, and a shrinking plan's leftovers (m3deploy.deploy.shrink). No host: the
inventories are files in a temporary directory, the record is written by m3deploy.controller.deployed."""
from __future__ import annotations

import ast
import json

import pytest
from click.testing import CliRunner

from m3deploy.cli import load, main
from m3deploy.controller import deployed, prune
from m3deploy.core.errors import M3Error
from m3deploy.deploy import hostfiles, shrink
from tests.unit.test_plan_snapshots import ROOT

GROUP_DATA = (ROOT / "group_data" / "testbed.py").read_text()


@pytest.fixture(autouse=True)
def _config(tmp_path, monkeypatch):
    monkeypatch.setenv("M3DEPLOY_CONFIG", str(tmp_path / "config"))


def _host(name: str, addr: str) -> str:
    return (f"    ({name!r}, {{'ssh_hostname': {addr!r}, 'ssh_user': 'root', 'ssh_key': '/k/id', "
            f"'ssh_password': 'hunter2', 'm3_address': {addr!r}}}),\n")


def inventory(tmp_path, workers, control=(("c1", "10.9.0.2"),), name="lab") -> str:
    d = tmp_path / "inv"
    (d / "group_data").mkdir(parents=True, exist_ok=True)
    (d / "group_data" / f"{name}.py").write_text(GROUP_DATA.replace('m3_cluster = "testbed"', 'm3_cluster = "lab"'))
    path = d / f"{name}.py"
    path.write_text("control = [\n" + "".join(_host(*h) for h in control) + "]\n"
                    "workers = [\n" + "".join(_host(*h) for h in workers) + "]\n")
    return str(path)


W = [("w1", "10.9.0.3"), ("w2", "10.9.0.4"), ("w3", "10.9.0.5")]


def deploy_record(inv: str) -> dict:
    """The record a deploy of `inv` writes (roles/record.py: each host's planned services and connection)."""
    hosts, plan = load(inv, facts=False)
    for h in hosts:
        deployed.write_host(plan, plan.host(h.name), {}, deployed.connection(h.data))
    return deployed.load(plan.name)


def test_the_record_keeps_how_to_reach_a_host_and_no_password(tmp_path):
    rec = deploy_record(inventory(tmp_path, W))
    assert rec["hosts"]["w3"]["connect"] == {"ssh_hostname": "10.9.0.5", "ssh_user": "root", "ssh_key": "/k/id"}
    assert rec["hosts"]["w3"]["address"] == "10.9.0.5"
    assert "hunter2" not in deployed.record_path("lab").read_text()


def test_a_host_left_out_is_a_candidate_and_the_deploy_says_so(tmp_path):
    rec = deploy_record(inventory(tmp_path, W))
    inv = inventory(tmp_path, W[:2])
    hosts, plan = load(inv, facts=False)
    assert prune.candidates(plan, rec) == ["w3"]
    msg = prune.warning(plan, rec, "inventories/lab.py")
    assert msg.startswith("w3: in the deploy record of cluster lab but not in the inventory")
    assert "`m3deploy prune inventories/lab.py --host w3`" in msg
    targets = prune.plan(plan, rec, hosts)
    assert [(t.name, t.connect["ssh_hostname"], t.address, t.services) for t in targets] == [
        ("w3", "10.9.0.5", "10.9.0.5", ("m3-worker@0",))]
    assert prune.warning(load(inventory(tmp_path, W), facts=False)[1], rec, "x") == ""


def test_the_inventory_prune_runs_with_holds_only_the_recorded_connection(tmp_path):
    rec = deploy_record(inventory(tmp_path, W))
    hosts, plan = load(inventory(tmp_path, W[:2]), facts=False)
    text = prune.inventory_text(prune.plan(plan, rec, hosts))
    tree = ast.parse(text)
    assign = next(n for n in tree.body if isinstance(n, ast.Assign))
    assert assign.targets[0].id == prune.GROUP
    assert ast.literal_eval(assign.value) == [("w3", {"ssh_hostname": "10.9.0.5", "ssh_user": "root",
                                                      "ssh_key": "/k/id"})]


def _refused(plan, rec, hosts, only=()) -> str:
    with pytest.raises(M3Error) as e:
        prune.plan(plan, rec, hosts, only)
    assert "Nothing was changed" in str(e.value) or "nothing to prune" in str(e.value)
    return str(e.value)


def test_another_clusters_inventory_is_refused(tmp_path):
    rec = deploy_record(inventory(tmp_path, W))
    hosts, plan = load(inventory(tmp_path, [("x1", "10.8.0.3")], control=(("x0", "10.8.0.2"),)), facts=False)
    assert "share no host" in _refused(plan, rec, hosts)


def test_no_record_is_refused(tmp_path):
    hosts, plan = load(inventory(tmp_path, W), facts=False)
    assert "lists no host" in _refused(plan, {}, hosts)


def test_hosts_of_the_inventory_must_be_deployed_first(tmp_path):
    rec = deploy_record(inventory(tmp_path, W[:2]))
    hosts, plan = load(inventory(tmp_path, [W[0], ("w9", "10.9.0.9")]), facts=False)
    assert "w9: in the inventory but not deployed yet" in _refused(plan, rec, hosts)


def test_a_control_host_is_never_pruned(tmp_path):
    rec = deploy_record(inventory(tmp_path, W, control=(("c1", "10.9.0.2"), ("c2", "10.9.0.6"), ("c3", "10.9.0.7"))))
    hosts, plan = load(inventory(tmp_path, W), facts=False)
    assert "c2 is a control host (it runs etcd, nats)" in _refused(plan, rec, hosts)


def test_a_renamed_host_at_a_planned_address_is_refused(tmp_path):
    """A typo in a host's name: the record's w3 and the inventory's w-3 are the same machine."""
    rec = deploy_record(inventory(tmp_path, W))
    hosts, plan = load(inventory(tmp_path, [*W[:2], ("w-3", "10.9.0.5")]), facts=False)
    rec["hosts"]["w-3"] = rec["hosts"]["w3"]  # deployed under its new name too
    assert "w3 was reached at 10.9.0.5, the address of w-3 in the inventory" in _refused(plan, rec, hosts)


def test_host_option_names_only_candidates(tmp_path):
    rec = deploy_record(inventory(tmp_path, W))
    hosts, plan = load(inventory(tmp_path, W[:2]), facts=False)
    assert "w2 is still in the inventory (remove it there first)" in _refused(plan, rec, hosts, ["w2"])
    assert "nope is not in the record" in _refused(plan, rec, hosts, ["nope"])
    assert [t.name for t in prune.plan(plan, rec, hosts, ["w3"])] == ["w3"]


def test_a_record_without_connection_data_is_refused(tmp_path):
    rec = deploy_record(inventory(tmp_path, W))
    del rec["hosts"]["w3"]["connect"]
    hosts, plan = load(inventory(tmp_path, W[:2]), facts=False)
    assert "no connection data" in _refused(plan, rec, hosts)


def test_the_command_lists_and_changes_nothing_without_yes(tmp_path):
    deploy_record(inventory(tmp_path, W))
    inv = inventory(tmp_path, W[:2])
    before = deployed.record_path("lab").read_text()
    r = CliRunner().invoke(main, ["prune", inv])
    assert r.exit_code == 0, r.output
    assert "- w3 (10.9.0.5, recorded " in r.output and "nothing was changed" in r.output
    assert f"m3deploy prune {inv} --host w3 --yes" in r.output
    assert deployed.record_path("lab").read_text() == before
    r = CliRunner().invoke(main, ["prune", inv, "--host", "w1", "--yes"])
    assert r.exit_code == 2 and "w1 is still in the inventory" in r.output, r.output
    assert deployed.record_path("lab").read_text() == before


def test_forget_drops_only_the_named_hosts(tmp_path):
    deploy_record(inventory(tmp_path, W))
    deployed.forget("lab", ["w3"])
    assert sorted(deployed.load("lab")["hosts"]) == ["c1", "w1", "w2"]


def test_the_diff_against_the_record_names_prune(tmp_path):
    rec = deploy_record(inventory(tmp_path, W))
    plan = load(inventory(tmp_path, W[:2]), facts=False)[1]
    assert any("w3: in the record but not in the plan" in x and "m3deploy prune" in x for x in deployed.diff(plan, rec))


# ---------------------------------------------------------------------------------------- a shrinking plan
def _manifest(tmp_path, *data):
    hosts, plan = load(inventory(tmp_path, W[:1]), data=data, facts=False)
    return hostfiles.checked_manifest(hostfiles.manifest(plan, plan.host("w1")), "w1")


def test_fewer_ranks_leave_the_removed_ranks_unit_env_and_rollback_copies(tmp_path):
    wide, narrow = _manifest(tmp_path, "m3_gpus_per_host=2"), _manifest(tmp_path)
    gone = shrink.leftovers(wide, narrow)
    assert gone["units"] == ["m3-worker@1.service"]
    assert sorted(gone["files"]) == ["/etc/m3/m3-worker@1.env", "/etc/systemd/system/m3-worker@1.service",
                                     "/var/lib/m3/rollback/m3-worker@1.env", "/var/lib/m3/rollback/m3-worker@1.service"]
    assert gone["dirs"] == ["/var/lib/m3/m3-worker@1"]  # the rank's state and HOME directory
    assert not any(gone[k] for k in ("caches", "venvs", "packages", "users", "containers", "images"))
    for key, entries in gone.items():  # the teardown's confinement rule holds for every entry
        assert all(not hostfiles.removal_problem(key, e) for e in entries), (key, entries)
    assert not any(shrink.leftovers(narrow, narrow).values())
    assert not any(shrink.leftovers(narrow, wide).values())  # growing removes nothing


def test_a_service_no_longer_planned_goes_and_a_directory_still_used_stays():
    old = {"units": ["etcd", "m3-worker@0"], "files": ["/etc/m3/etcd.env", "/etc/m3/m3-worker@0.env"],
           "dirs": ["/var/lib/m3/etcd", "/etc/m3"], "packages": ["etcd-server"], "caches": ["/opt/m3/models"],
           "venvs": ["/opt/m3/dynamo-1.6.0"], "users": ["m3"]}
    new = {"units": ["m3-worker@0"], "files": ["/etc/m3/m3-worker@0.env", "/opt/m3/models/x/config.json"],
           "dirs": ["/etc/m3"], "packages": [], "caches": [], "venvs": ["/opt/m3/dynamo-1.6.1"], "users": ["m3"]}
    gone = shrink.leftovers(old, new)
    assert (gone["units"], gone["files"], gone["dirs"], gone["packages"]) == (
        ["etcd"], ["/etc/m3/etcd.env"], ["/var/lib/m3/etcd"], ["etcd-server"])
    assert gone["caches"] == []  # it holds a file of the new plan
    assert gone["venvs"] == ["/opt/m3/dynamo-1.6.0"] and gone["users"] == []


def test_manifest_json_round_trip_keeps_leftovers_checked(tmp_path):
    wide = _manifest(tmp_path, "m3_gpus_per_host=2")
    again = hostfiles.read_manifest(json.dumps({"m3deploy_manifest": hostfiles.MANIFEST_VERSION, **wide}), "w1")
    assert again == wide
