"""The host's manifest: what the deploy makes on it (m3deploy.deploy.hostfiles.manifest), written to
/etc/m3/manifest.json before anything else changes, so that teardown (roles/teardown.py) removes exactly that,
even after a deploy that stopped half-way. `m3deploy render` shows the same file.

Reads cluster_plan(), host_plan() (through roles/_units.plans()).
"""
from pyinfra.api import deploy

from m3deploy.deploy import hostfiles
from roles import _units as u


@deploy("Write the deploy manifest")
def write_manifest():
    cp, hp = u.plans()
    u.ship(hostfiles.manifest_file(cp, hp))
