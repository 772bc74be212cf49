"""The secrets a cluster's host files carry, from the controller (m3deploy.controller.secrets, .tls): generated
once per cluster, the API key, the internal and edge certificates. m3deploy.deploy.hostfiles puts them in."""
from __future__ import annotations

import functools

from m3deploy.controller.secrets import KNOWN, api_key, ensure_secrets
from m3deploy.core.build import API_KEY_SECRET
from m3deploy.core.internal_tls import is_tls_ref
from m3deploy.core.model import ClusterPlan
from m3deploy.deploy.render import secret_names


@functools.lru_cache(maxsize=None)
def generated(cluster: str, extra: tuple[str, ...] = ()) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(ensure_secrets(cluster, names=tuple(KNOWN) + extra).items()))


def secrets_for(cp: ClusterPlan) -> dict[str, str]:
    """The generated secrets of the cluster (with the on-demand ones its services' secret files name: an MPI
    world's SSH keys), its API key (m3_api_key_file) when it has one, and the edge's."""
    extra = sorted({n for h in cp.hosts for s in h.services for _, ref in s.secret_files for n in secret_names(ref)
                    if not is_tls_ref(ref)})
    out = dict(generated(cp.name, tuple(extra)))
    out.update(_tls_secrets(cp))  # m3_internal_tls: the CA, each host's certificates and keys (controller.tls)
    key = api_key(cp)
    if key:
        out[API_KEY_SECRET] = key
    if cp.endpoint.startswith("https://"):  # the edge's TLS material and the hashes of every valid key
        out.update(_edge_secrets(cp))
    return out


_TLS: dict[tuple, dict[str, str]] = {}  # (cluster, its TLS files) -> certificates: signed once per run


def _tls_secrets(cp: ClusterPlan) -> dict[str, str]:
    from m3deploy.controller import tls

    refs = tuple(sorted({(h.name, h.address, r) for h in cp.hosts for s in h.services for _, r in s.secret_files
                         if is_tls_ref(r)}))
    if refs and (cp.name, refs) not in _TLS:
        _TLS[(cp.name, refs)] = tls.cluster_certs(cp)
    return _TLS.get((cp.name, refs), {})


def _edge_secrets(cp: ClusterPlan) -> dict[str, str]:
    from m3deploy.controller import secrets, tls
    from m3deploy.core import edge

    return {edge.TLS_SECRET: tls.edge_pem(cp), edge.KEYS_SECRET: edge.key_hashes(secrets.api_keys(cp))}
