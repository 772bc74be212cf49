"""The host's manifest: what the deploy makes on it (m3deploy.deploy.hostfiles.manifest), written to
/etc/m3/manifest.json before anything else changes, so that teardown (roles/teardown.py) removes exactly that,
even after a deploy that stopped half-way. `m3deploy render` shows the same file.

A shrinking plan: before the new manifest is written, what the host's previous one names and the new one does not
(m3deploy.deploy.shrink.leftovers: a rank or service no longer planned there, its unit, env and config files, a
package, an old venv) is removed by the teardown's own operations (roles/teardown.remove). A host with no manifest
or an unreadable one is left as it is (said in the run's output).

Reads cluster_plan(), host_plan() (through roles/lifecycle.plans()); setting m3_keep_caches (a leftover venv or cache
stays).
"""
from pyinfra import host
from pyinfra.api import deploy

from m3deploy.core.errors import M3Error
from m3deploy.deploy import hostfiles, shrink
from roles import hostops, lifecycle
from roles.teardown import DeployManifest, remove


@deploy("Write the deploy manifest")
def write_manifest():
    cp, hp = lifecycle.plans()
    new = hostfiles.manifest(cp, hp)
    text = host.get_fact(DeployManifest)
    if text.strip():
        try:
            gone = shrink.leftovers(hostfiles.read_manifest(text, hp.name), hostfiles.checked_manifest(new, hp.name))
        except M3Error as e:
            host.noop(f"the previous manifest is not used, nothing it names is removed: {e}")
            gone = {}
        if any(gone.values()) and _generation_changes(cp):
            gone, new = shrink.keep_previous_generation(gone, new)
        if any(gone.values()):
            remove(gone, keep=bool(cp.setting("m3_keep_caches")), final=False)
    hostops.ship(hostfiles.manifest_file(cp, hp, new))


def _generation_changes(cp) -> bool:
    """Does this deploy change the workers' generation against the deploy record (the last completed deploy)?"""
    from m3deploy.controller import deployed

    return bool(cp.generation) and bool(deployed.generation_change(cp, deployed.load(cp.name)))
