"""Every systemd unit m3deploy ships comes from one base: templates/*.service.j2 extend templates/unit-base.j2,
and the lines they share (the managed-by header, the restart policy, [Install]) are written there only."""
from __future__ import annotations

from pathlib import Path

import jinja2.nodes
import pytest

from m3deploy.deploy.render import environment

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
BASE = "unit-base.j2"
UNITS = sorted(p.name for p in TEMPLATES.glob("*.service.j2"))
SHARED = ("# Managed by m3deploy", "[Unit]", "StartLimitIntervalSec=0", "[Service]", "Restart=always",
          "[Install]", "WantedBy=multi-user.target")


def test_the_units_are_found():
    assert {"etcd.service.j2", "nats.service.j2", "m3-frontend.service.j2", "m3-worker@.service.j2",
            "m3-watchdog.service.j2", "m3-monitor.service.j2", "m3-edge.service.j2"} <= set(UNITS)


@pytest.mark.parametrize("name", UNITS)
def test_unit_template_extends_the_base(name):
    env = environment()
    ast = env.parse(env.loader.get_source(env, name)[0])
    extends = list(ast.find_all(jinja2.nodes.Extends))
    assert len(extends) == 1 and isinstance(extends[0].template, jinja2.nodes.Const) \
        and extends[0].template.value == BASE, f"templates/{name} does not `{{% extends \"{BASE}\" %}}`"
    outside = [n for n in ast.body if not isinstance(n, (jinja2.nodes.Extends, jinja2.nodes.Block))
               and not (isinstance(n, jinja2.nodes.Output) and all(
                   isinstance(c, jinja2.nodes.TemplateData) and not c.data.strip() for c in n.nodes))]
    assert not outside, f"templates/{name}: text outside a block is never rendered in a child template"


@pytest.mark.parametrize("name", UNITS)
def test_shared_lines_live_in_the_base_only(name):
    lines = {line.strip() for line in (TEMPLATES / name).read_text().splitlines()}
    assert not [s for s in SHARED if any(line.startswith(s) for line in lines)], \
        f"templates/{name} restates a line of {BASE}; fill a block instead"
