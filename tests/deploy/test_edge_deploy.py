"""deploy.py with the edge (m3_edge, Dynamo, an API key file of two keys) on pyinfra's `@fake` connector, as in
test_deploy_py.py: the control host gets the package's haproxy.service masked before haproxy is installed, the
edge's files (the certificate+key and the keys' hashes 0600 root, created with their mode before their content),
m3-edge.service started and waited for; its frontends' restarts go through the drained restart (roles/edge.py);
no key is in an op name, a command or any upload, and no CA or edge private key is anywhere but edge.pem.
The edge running for real: tests/e2e/test_edge.py."""
from __future__ import annotations

import hashlib

from m3deploy.controller import tls
from m3deploy.controller.secrets import load_secrets
from m3deploy.core import build as planmod
from m3deploy.core import edge, inventory
from tests.deploy.test_deploy_py import ROOT, Cluster, assert_role_order, controller, op  # noqa: F401 (fixture)
from tests.unit.test_edge_plan import KEYS, key_file  # noqa: F401 (fixture)


def _cluster(override: dict) -> Cluster:
    c = Cluster("gb200", override_data=override)
    c.plan = planmod.build(inventory.load_inventory(ROOT / "inventories" / "gb200.py", override_data=override),
                           name="gb200")
    return c


def test_edge_on_the_control_host(key_file):  # noqa: F811 (the imported fixture)
    c = _cluster({"m3_serving": "dynamo", "m3_edge": True, "m3_api_key_file": str(key_file)})
    run = c.run(state="fresh")
    assert run.error is None, run.error
    assert_role_order(run, c)
    (ctl,) = [h.name for h in c.plan.group("control")]
    ops = run.for_host(ctl)
    names = [o.name.split(" | ", 1)[-1] for o in ops]
    mask, install = names.index("Mask the package's haproxy.service"), names.index("Install haproxy")
    assert mask < install
    assert "ln -s /dev/null /etc/systemd/system/haproxy.service" in " ".join(ops[mask].commands)
    for path in (edge.EDGE_PEM, edge.EDGE_KEYS):
        o = op(ops, f"Render {path}")
        up = o.commands.index(f"UPLOAD {path}")
        assert any(f"chmod 0600 {path}" in x and "touch" in x and "chown root:root" in x for x in o.commands[:up])
    hashes = op(ops, f"Render {edge.EDGE_KEYS}").uploads[edge.EDGE_KEYS]
    assert hashes.splitlines() == [hashlib.sha256(k.encode()).hexdigest().upper() for k in KEYS]
    store = load_secrets("gb200")
    pem = op(ops, f"Render {edge.EDGE_PEM}").uploads[edge.EDGE_PEM]
    assert pem == store[tls.EDGE_CERT] + store[tls.EDGE_KEY]
    cfg = op(ops, f"Render {edge.EDGE_CONF}").uploads[edge.EDGE_CONF]
    assert f"bind {c.plan.host(ctl).address}:8443 ssl crt {edge.EDGE_PEM}" in cfg
    assert "Start m3-edge.service" in names and any(n.startswith("Wait for m3-edge.service") for n in names)
    for fe in ("m3-frontend.service", "m3-frontend-1.service"):
        assert f"Restart {fe} drained at the edge (its files changed)" in names, names
    secret = [*KEYS, store[tls.CA_KEY], store[tls.EDGE_KEY]]
    for name, host_ops in run.ops_by_host.items():
        for o in host_ops:
            assert not any(s in o.name or any(s in x for x in o.commands) for s in secret), (name, o.name)
            for dest, text in o.uploads.items():
                allowed = {edge.EDGE_PEM: [store[tls.EDGE_KEY]]}.get(dest, [])
                assert not any(s in text for s in secret if s not in allowed), (name, dest)
    assert c.plan.endpoint == f"https://{c.plan.host(ctl).address}:8443/v1"
