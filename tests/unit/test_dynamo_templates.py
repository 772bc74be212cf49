"""Rendering of the control-plane/worker templates from hand-built plans (no SSH)."""
import dataclasses
import re
import shlex

import pytest
from sample_plans import gpu_worker, sim_plan

from m3deploy.core.errors import M3Error
from m3deploy.deploy import hostfiles
from m3deploy.deploy.render import env_line, render, service_env, systemd_arg, systemd_argv

SECRETS = {"nats-password": "m3p-NATSsecret", "etcd-password": "m3p-ETCDsecret",
           "etcd-root-password": "m3p-ROOTsecret"}
TEMPLATE = {"etcd": "etcd.service.j2", "nats": "nats.service.j2", "frontend": "m3-frontend.service.j2",
            "worker": "m3-worker@.service.j2"}


def all_services():
    plan = sim_plan()
    return [s for h in plan.hosts for s in h.services] + [gpu_worker("g1", "10.0.0.9", "10.77.0.2")]


def unit(s, **kw):
    return render(TEMPLATE[s.kind], cluster="testbed", service=s, user="root", timeout_start_s=150,
                  stop_timeout_s=30, restart_s=hostfiles.restart_s(s), auth_script="/usr/local/lib/m3/m3-etcd-auth.py",
                  unregister_script="", **kw)


def systemd_split(line):
    """Approximate systemd's ExecStart splitting (quotes, \\ escapes, $$ and %%)."""
    return [a.replace("$$", "$").replace("%%", "%") for a in shlex.split(line)]


@pytest.mark.parametrize("s", all_services(), ids=lambda s: f"{s.host}-{s.name}")
def test_unit_runs_the_plan_command_and_holds_no_secret(s):
    text = unit(s)
    execs = [ln.split("=", 1)[1] for ln in text.splitlines() if ln.startswith("ExecStart=")]
    assert len(execs) == 1
    assert systemd_split(execs[0]) == list(s.command)
    for v in SECRETS.values():
        assert v not in text
    assert "0.0.0.0" not in text
    assert "TimeoutStartSec=150" in text
    assert re.search(r"^User=root$", text, re.M)
    if s.image:
        assert f"ExecStartPre=-/usr/bin/docker rm -f {s.name.replace('@', '-')}" in text
        assert f"ExecStop=/usr/bin/docker stop --time 30 {s.name.replace('@', '-')}" in text
        assert "Requires=docker.service" in text and "EnvironmentFile" not in text
    else:
        assert f"EnvironmentFile={s.env_file}" in text
        assert f"WorkingDirectory={s.workdir}" in text


@pytest.mark.parametrize("s", all_services(), ids=lambda s: f"{s.host}-{s.name}")
def test_unit_restarts_forever_and_stops_gracefully(s):
    """Dynamo exits 0 when it loses its etcd lease (issue 12): only Restart=always brings it back, and
    StartLimitIntervalSec=0 (in [Unit], where systemd 252 reads it) keeps a crash loop from giving up forever."""
    text = unit(s)
    unit_section = text.split("[Service]")[0]
    assert "StartLimitIntervalSec=0" in unit_section
    assert "Restart=always" in text
    assert f"RestartSec={1 if s.kind in ('worker', 'frontend') else 2}" in text
    if s.kind in ("worker", "frontend"):
        # SIGTERM to the main process only (Dynamo unregisters and drains), SIGKILL after the drain bound
        assert "KillMode=mixed" in text and "KillSignal=SIGTERM" in text and "TimeoutStopSec=40" in text


@pytest.mark.parametrize("s", all_services(), ids=lambda s: f"{s.host}-{s.name}")
def test_env_file_has_env_then_secrets(s):
    text = service_env(s, SECRETS)
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    names = [ln.split("=", 1)[0] for ln in lines]
    assert names == [k for k, _ in s.env] + [k for k, _ in s.secret_env]
    for _, secret in s.secret_env:
        assert SECRETS[secret] in text
    if s.image:  # docker --env-file: literal
        assert 'DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS=["generate"]' in text
    elif s.kind == "worker":  # systemd: quoted so the JSON keeps its quotes
        assert 'DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS="[\\"generate\\"]"' in text


def test_missing_secret_is_a_clear_error():
    s = sim_plan().host("ctl").service("nats")
    with pytest.raises(M3Error, match="nats-password"):
        service_env(s, {})


def test_systemd_quoting():
    assert systemd_arg("--block-size") == "--block-size"
    assert systemd_arg('{"a":1}') == '"{\\"a\\":1}"'
    assert systemd_arg("50%") == '"50%%"'
    assert systemd_arg("$HOME") == '"$$HOME"'
    argv = ["x", '{"k": "v w"}', "a b", "100%", "$X", "back\\slash"]
    assert systemd_split(systemd_argv(argv)) == argv
    with pytest.raises(M3Error):
        systemd_arg("a\nb")


def test_env_line_dialects():
    assert env_line("A", "plain-1.2:3") == "A=plain-1.2:3"
    assert env_line("A", 'x "y" $z') == 'A="x \\"y\\" \\$z"'
    assert env_line("A", 'x "y"', "docker") == 'A=x "y"'
    with pytest.raises(M3Error):
        env_line("A", "two\nlines")
    with pytest.raises(M3Error):
        env_line("1BAD", "x")


def test_nats_conf_binds_planned_addresses_and_has_no_secret():
    s = sim_plan().host("ctl").service("nats")
    ports = {p.name: p for p in s.ports}
    text = render("nats.conf.j2", cluster="t", service=s, client=ports["client"], monitor=ports["monitor"],
                  store_dir="/var/lib/m3/nats/jetstream", auth=True, max_payload=33554432)
    assert "listen: 10.77.0.2:4222" in text and "http: 10.77.0.2:8222" in text
    assert "max_payload: 33554432" in text and 'store_dir: "/var/lib/m3/nats/jetstream"' in text
    assert "password: $NATS_AUTH_PASSWORD" in text
    assert "0.0.0.0" not in text
    assert "authorization" not in render("nats.conf.j2", cluster="t", service=s, client=ports["client"],
                                         monitor=ports["monitor"], store_dir="/x", auth=False, max_payload=1)


@pytest.mark.parametrize("s", [s for s in all_services() if s.kind == "worker"], ids=lambda s: f"{s.host}-{s.name}")
def test_a_killed_dynamo_worker_is_unregistered_before_its_restart(s):
    """A SIGKILLed process leaves its etcd records for its lease's 30 s and the frontend keeps routing there
    (files/m3-unregister-dead.py). systemd runs ExecStopPost after every stop, a kill included, before the restart;
    `-` ignores its failure, `+` runs it as root (the env file is 0600 root, the unit's User= may be m3), and the env
    file's path is its only argument besides the dialect: no secret in argv. A container's `docker run` client can
    die while its container lives on: its unit also runs it after the `docker rm -f` of the next start."""
    text = hostfiles.unit_file(sim_plan(), s).text
    posts = [ln for ln in text.splitlines() if ln.startswith("ExecStopPost=")]
    dialect = "docker" if s.image else "systemd"
    assert len(posts) == 1 and posts[0].startswith("ExecStopPost=-+"), posts
    assert systemd_split(posts[0].split("=-+", 1)[1]) == ["/usr/bin/python3", hostfiles.UNREGISTER_DEAD, s.env_file,
                                                          dialect]
    pres = [ln.split("=", 1)[1] for ln in text.splitlines() if ln.startswith("ExecStartPre=")]
    if s.image:
        assert pres[0].startswith("-/usr/bin/docker rm -f ") and pres[1] == posts[0].split("=", 1)[1], pres
    else:
        assert pres == []
    for v in SECRETS.values():
        assert v not in text
    # and the script is on the host, once, before the first unit that runs it
    hp = next(h for h in sim_plan().hosts if any(x.kind == "worker" for x in h.services))
    paths = [f.path for f in hostfiles.service_files(sim_plan(), hp, None)]
    assert paths.count(hostfiles.UNREGISTER_DEAD) == 1
    assert paths.index(hostfiles.UNREGISTER_DEAD) < paths.index(f"/etc/systemd/system/{hp.services[0].unit}")


def test_a_worker_without_dynamo_has_no_unregister_step():
    """Standalone vLLM registers nowhere: no ExecStopPost, no script."""
    s = dataclasses.replace(gpu_worker("g1", "10.0.0.9", "10.77.0.2"),
                            env=(("HF_HUB_OFFLINE", "1"),), secret_env=())
    assert "m3-unregister-dead" not in hostfiles.unit_file(sim_plan(), s).text


def test_etcd_unit_runs_auth_script_only_when_asked():
    s = sim_plan().host("ctl").service("etcd")
    assert "ExecStartPost=/usr/bin/python3 /usr/local/lib/m3/m3-etcd-auth.py" in unit(s)
    text = render("etcd.service.j2", cluster="t", service=s, user="etcd", timeout_start_s=90, restart_s=2,
                  auth_script="")
    assert "ExecStartPost" not in text and "Type=notify" in text and "User=etcd" in text


def test_planned_wildcard_address_is_rendered_as_planned():
    from dataclasses import replace
    s = sim_plan().host("ctl").service("nats")
    s = replace(s, ports=tuple(replace(p, address="0.0.0.0") for p in s.ports))
    ports = {p.name: p for p in s.ports}
    text = render("nats.conf.j2", cluster="t", service=s, client=ports["client"], monitor=ports["monitor"],
                  store_dir="/x", auth=True, max_payload=1)
    assert "listen: 0.0.0.0:4222" in text
