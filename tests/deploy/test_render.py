"""`m3deploy render` writes what the deploy ships: for every shipped inventory (test_deploy_py's @fake runs of
deploy.py, fresh hosts), every file the roles upload from m3deploy.deploy.hostfiles equals the file render
wrote (secret lines aside, which render masks), with the same mode and owner; every file render wrote is
uploaded; and the nats-server mask is the link render shows. Teardown removes what the host's manifest names.

Not rendered (they are not m3's stack, or do not stay): the drivers role's /etc/nvidia-imex/nodes_config.cfg,
the weights role's HF token (removed after the download) and the images role's build context (removed after the
build)."""
from __future__ import annotations

import json
import shlex

import pytest
from click.testing import CliRunner
from pyinfra.facts.files import Directory, File, Link

from m3deploy.cli import main
from m3deploy.deploy import hostfiles
from m3deploy.deploy.context import InvalidPlan
from roles.teardown import DeployManifest
from tests.deploy.test_deploy_py import INVENTORIES, ROOT, Cluster, cluster_run, controller, dynamo_ready  # noqa: F401

NOT_RENDERED = ("/etc/nvidia-imex/nodes_config.cfg", "/etc/m3/hf_token", "/var/lib/m3/images/")


def _render(inv: str, out) -> dict:
    res = CliRunner().invoke(main, ["render", str(ROOT / "inventories" / f"{inv}.py"), str(out)])
    assert res.exit_code == 0, res.output
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


def _put_options(op, path: str) -> str:
    """`mode:user:group` as put_text sets them (its last command: chown user:group PATH && chmod MODE PATH)."""
    last = op.commands[-1].split()
    assert last[0] == "chown" and last[4] == "chmod", op.commands
    user, group = last[1].split(":")
    return f"{last[5]}:{user}:{group}"


def _masked(text: str) -> list[str]:
    return [line for line in text.splitlines() if "<secret: " not in line]


def _save_preflight_facts(cluster) -> None:
    """What `m3deploy preflight` saves for the multi-host GPU hosts (their networking env comes from live facts
    in a deploy; render, like `plan`, reads these), from the same fact values the @fake hosts answer."""
    from m3deploy import facts
    from m3deploy.controller import factcache

    factcache.save(cluster.plan.name, {
        h.name: {"default_interface": t[facts.DefaultRouteInterface], "rdma": t[facts.RdmaDevices]}
        for h in cluster.plan.hosts if h.needs_rdma for t in [cluster.facts(h.name, "fresh")]})


@pytest.mark.parametrize("inv", INVENTORIES)
def test_the_roles_ship_exactly_what_render_writes(inv, cluster_run, tmp_path):
    cluster, run = cluster_run(inv, state="fresh")
    assert run.error is None
    _save_preflight_facts(cluster)
    index = _render(inv, tmp_path / "render")
    from m3deploy.controller.secrets import load_secrets

    store = load_secrets(cluster.plan.name)
    for name, ops in run.ops_by_host.items():
        uploads = {dest: (text, o) for o in ops for dest, text in o.uploads.items()
                   if not dest.startswith(NOT_RENDERED)}
        entries = {e["path"]: e for e in index[name]["files"]}
        files = {p: e for p, e in entries.items() if "link" not in e}
        assert set(uploads) == set(files), (name, set(uploads) ^ set(files))
        for path, (text, o) in uploads.items():
            e = files[path]
            rendered = (tmp_path / "render" / name / path.lstrip("/")).read_text()
            assert _put_options(o, path) == f"{e['mode']}:{e['owner']}", (name, path)
            if e.get("secret"):
                # the same file but for the secret lines: render masks them, the host gets the store's values
                keys = {x.split("=", 1)[0] + "=" for x in rendered.splitlines() if "<secret: " in x}
                assert _masked(rendered) == [x for x in text.splitlines() if not x.startswith(tuple(keys))], \
                    (name, path)
                assert not any(v in rendered for v in store.values()), (name, path)
                assert "<secret: " in rendered and "<secret: " not in text
            else:
                assert rendered == text, (name, path)
                assert e["sha256"] == hostfiles.HostFile(path, text).sha256
        for path, e in entries.items():
            if "link" in e:  # the nats-server mask
                assert (tmp_path / "render" / name / path.lstrip("/")).readlink().as_posix() == e["link"]
                assert any(f"ln -s {e['link']} {path}" in c for o in ops for c in o.commands), (name, path)


def test_render_of_a_host_is_its_manifest_and_files(tmp_path):
    """--host: only that host; the manifest names every file and link render wrote."""
    out = tmp_path / "r"
    res = CliRunner().invoke(main, ["render", str(ROOT / "inventories/gb200.py"), str(out), "--host", "gb200-ctl-01"])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == ["gb200-ctl-01", "gb200-ctl-01.json"]
    index = json.loads((out / "gb200-ctl-01.json").read_text())
    manifest = json.loads((out / "gb200-ctl-01" / hostfiles.MANIFEST.lstrip("/")).read_text())
    assert {e["path"] for e in index["files"]} == {*manifest["files"], *manifest["links"]}
    assert {"etcd-server", "nats-server"} == set(manifest["packages"]) and manifest["users"] == ["m3"]
    # a second render replaces the first (a reviewer diffs two of them), an unknown host writes nothing
    assert CliRunner().invoke(main, ["render", str(ROOT / "inventories/gb200.py"), str(out)]).exit_code == 0
    res = CliRunner().invoke(main, ["render", str(ROOT / "inventories/gb200.py"), str(tmp_path / "x"),
                                    "--host", "nope"])
    assert res.exit_code == 2 and "nope" in res.output and "Fix" in res.output and not (tmp_path / "x").exists()


# ------------------------------------------------------------------------------------------ teardown

TEARDOWN = {"m3_state": "absent"}


EXISTS = {File: lambda path: {"mode": 644}, Directory: lambda path: {"mode": 755},
          Link: lambda path: {"link_target": "/dev/null"}}  # everything is there: each removal is a command


def _removed(ops) -> list[str]:
    """The paths the host's teardown ops delete (`rm -f` / `rm -rf`; op names are shared between hosts)."""
    return [shlex.split(c)[-1] for o in ops for c in o.commands if c.startswith(("rm -f ", "rm -rf "))]


def _paths(m: dict) -> set[str]:
    return {p for k in ("files", "links", "dirs", "caches", "venvs") for p in m[k]}


def _manifest(cluster, name, **change) -> str:
    m = hostfiles.manifest(cluster.plan, cluster.plan.host(name))
    m.update(change)
    return json.dumps(m)


def test_teardown_removes_what_the_manifest_names_and_nothing_else(controller):
    """A host whose manifest (from an earlier deploy) names an extra m3 file and not one of the plan's
    directories: exactly the manifest's paths go; the plan's other directory stays."""
    cluster = Cluster("gb200", override_data=TEARDOWN)
    ctl = cluster.hosts[0].name
    plan_m = hostfiles.manifest(cluster.plan, cluster.plan.host(ctl))
    nats_dir = next(d for d in plan_m["dirs"] if d.endswith("/nats"))
    extra = "/etc/m3/m3-worker@7.env"
    text = _manifest(cluster, ctl, files=[*plan_m["files"], extra], dirs=[d for d in plan_m["dirs"] if d != nats_dir])
    t1 = cluster.hosts[1].name
    run = cluster.run(facts={ctl: {DeployManifest: text, **EXISTS}, t1: EXISTS})
    assert run.error is None
    removed = _removed(run.for_host(ctl))
    assert extra in removed and nats_dir not in removed, removed
    # the manifest itself goes last, with /etc/m3: a teardown that stops half-way runs again from it
    assert set(removed) == _paths(json.loads(text)) - {hostfiles.MANIFEST} and removed[-1] == hostfiles.ETC_DIR
    # a host without a manifest (deployed before manifests): the plan's, as before
    plan_t1 = hostfiles.manifest(cluster.plan, cluster.plan.host(t1))
    assert set(_removed(run.for_host(t1))) == _paths(plan_t1) - {hostfiles.MANIFEST}


@pytest.mark.parametrize("key,entry", [
    ("dirs", "/var/lib"), ("caches", "/usr/local"), ("files", "/etc/passwd"),
    ("links", "/etc/systemd/system/ssh.service"),
    ("units", "ssh.service"), ("packages", "openssh-server"), ("users", "root"), ("containers", "postgres"),
    ("venvs", "/opt/m3/../../usr"),
])
def test_a_manifest_naming_what_m3_did_not_make_stops_the_teardown(controller, key, entry):
    cluster = Cluster("gb200", override_data=TEARDOWN)
    ctl = cluster.hosts[0].name
    text = _manifest(cluster, ctl, **{key: [entry]})
    run = cluster.run(facts={ctl: {DeployManifest: text}}, raises=(InvalidPlan,))
    # raised while pyinfra prepares (it then runs no operation on any host), before this host has an operation
    assert isinstance(run.error, InvalidPlan) and run.error.exit_code == 2 and run.for_host(ctl) == []
    msg = run.error.message
    assert msg.startswith("teardown refused, nothing was changed") and all(s in msg for s in (
        f"host {ctl}", hostfiles.MANIFEST, key, entry, "Fix")), msg


def test_teardown_twice_is_idempotent_by_its_manifest(controller):
    """The second run finds no manifest (it went with /etc/m3) and removes by the plan: the same paths, each
    already absent (pyinfra's files ops then change nothing)."""
    cluster = Cluster("gb200", override_data=TEARDOWN)
    ctl = cluster.hosts[0].name
    first = _removed(cluster.run(facts={ctl: {DeployManifest: _manifest(cluster, ctl), **EXISTS}}).for_host(ctl))
    assert first and first == _removed(cluster.run(facts={ctl: EXISTS}).for_host(ctl))
    gone = {File: lambda path: None, Directory: lambda path: None, Link: lambda path: None}
    assert _removed(cluster.run(facts={ctl: gone}).for_host(ctl)) == []  # all gone: nothing to do


# ------------------------------------------------------------------------------- a shrinking plan, prune

def test_a_deploy_removes_what_the_previous_manifest_named_and_the_new_one_does_not(controller):
    """The host's previous manifest names a rank the plan no longer has (m3-worker@7): the deploy stops and
    disables its unit and removes its files (and their rollback copies) before it writes the new manifest; a host
    whose manifest is the plan's own gets no removal at all (a no-change re-run stays one)."""
    cluster = Cluster("gb200")
    ctl, t1 = cluster.hosts[0].name, cluster.hosts[1].name
    plan_m = hostfiles.manifest(cluster.plan, cluster.plan.host(t1))
    extra = ["/etc/m3/m3-worker@7.env", "/etc/systemd/system/m3-worker@7.service"]
    old = _manifest(cluster, t1, units=[*plan_m["units"], "m3-worker@7.service"], files=[*plan_m["files"], *extra])
    run = cluster.run(facts={t1: {DeployManifest: old, **EXISTS}, ctl: {DeployManifest: _manifest(cluster, ctl)}})
    assert run.error is None
    ops = run.for_host(t1)
    stop = next(o for o in ops if o.name.endswith("Stop and disable the m3 units"))
    assert "m3-worker@7.service" in stop.commands[0] and "m3-worker@0.service" not in stop.commands[0]
    assert set(_removed(ops)) == {*extra, *(f"{hostfiles.ROLLBACK_DIR}/{p.rsplit('/', 1)[1]}" for p in extra)}
    names = [o.name for o in ops]
    assert names.index(stop.name) < next(i for i, n in enumerate(names) if hostfiles.MANIFEST in n)
    assert not any(n.endswith("Stop and disable the m3 units") for n in (o.name for o in run.for_host(ctl)))
    mine = [o.name for o in run.for_host(ctl) if o.name.startswith("Write the deploy manifest")]
    assert mine and all(hostfiles.MANIFEST in n or "/etc/m3" in n for n in mine), mine


def test_prune_drains_the_workers_then_removes_what_the_manifest_names(controller, fake):
    from roles.teardown import prune_host

    cluster = Cluster("gb200")
    t1 = cluster.hosts[1].name
    text = _manifest(cluster, t1)
    run = fake(prune_host, facts={DeployManifest: text, **EXISTS})
    names = [o.name for o in run.ops]
    drains = [n for n in names if "Drain m3-worker@" in n]
    assert drains and names.index(drains[-1]) < next(i for i, n in enumerate(names) if "Stop and disable" in n)
    m = json.loads(text)
    assert set(_removed(run.ops)) == _paths(m) - {hostfiles.MANIFEST} and _removed(run.ops)[-1] == hostfiles.ETC_DIR


def test_prune_refuses_a_host_without_a_manifest(fake):
    from roles.teardown import prune_host

    with pytest.raises(InvalidPlan) as e:
        fake(prune_host, facts={DeployManifest: ""})
    assert "prune refused, nothing was changed" in e.value.message and "no /etc/m3/manifest.json" in e.value.message
