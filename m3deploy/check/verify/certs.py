"""verify's `cert/...` checks (issue 35): one per certificate the controller can see for the plan
(m3deploy.controller.certs.inventory: the cluster CA or CAs, the edge's, each host's internal ones, the user's own
edge certificate), each with its days left; a certificate inside the renewal window (m3_cert_renew_days; for the
CA, that plus m3_cert_validity_days, unless its rotation has begun), expired, or not strict X.509 fails, naming
what the next deploy does about it (or, for the user's own, the file to replace)."""
from __future__ import annotations

import shlex
from collections.abc import Callable

from m3deploy.check.checks import Check, CheckFailed, Context
from m3deploy.controller import certs, tls
from m3deploy.controller import secrets as store
from m3deploy.core.model import ClusterPlan


def check_id(c: certs.Cert) -> str:
    if c.role.startswith("ca"):
        return "cert/" + c.name.replace(" (", "-").replace(")", "").replace(" ", "-").lower()
    if c.name.startswith("edge"):
        return "cert/edge" + ("-user" if not c.renewed_by_deploy else "")
    return "cert/" + c.name.replace(" ", "/")


def _fn(plan: ClusterPlan, cid: str) -> Callable[[Context], str]:
    def fn(ctx: Context) -> str:
        data = store.load_secrets(plan.name)
        c = next((c for c in certs.inventory(plan, data) if check_id(c) == cid), None)
        if c is None:
            raise CheckFailed("not in the controller's secrets store: run the deploy (it makes it)")
        why = certs.due(plan, c, data)
        said = f"{c.days_left} days left (not after {c.not_after}), issuer {c.issuer}"
        if why:
            fix = ("replace the file (and its key), then re-run the deploy" if not c.renewed_by_deploy else
                   "re-run the deploy: it re-issues it and rolls it out (docs/OPERATIONS.md \"Certificates over the "
                   "cluster's life\")")
            raise CheckFailed(f"{why}; {said}. Fix: {fix}")
        return said + ("; its rotation has begun (step 1 of 3 deployed)" if c.role == "ca" and
                       tls.NEXT_CERT in data else "")
    return fn


def cert_checks(plan: ClusterPlan, only_host: str | None = None) -> list[Check]:
    if not (tls.wanted(plan) or tls.edge_names(plan)):
        return []
    found = certs.inventory(plan)
    if not found and (tls.wanted(plan) or certs.own_edge(plan)):  # nothing made yet: the CA's check says so
        found = [certs.Cert("cluster CA", tls.CA_CERT, "ca", (), "", "", "", 0, (), True)]
    out = []
    for c in found:
        if only_host and only_host not in c.hosts:
            continue
        target = c.hosts[0] if len(c.hosts) == 1 else "controller"
        src = str(store.secrets_path(plan.name)) if c.renewed_by_deploy else c.source
        out.append(Check(id=check_id(c), group="cert", target=target,
                         title=f"{c.name} certificate: more days left than the renewal window, strict X.509",
                         fn=_fn(plan, check_id(c)),
                         reproduce=f"m3deploy certs INVENTORY  # {c.source} in {shlex.quote(src)}"))
    return out
