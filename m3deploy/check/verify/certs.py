"""verify's `cert/...` checks (issue 35): one per certificate the controller can see for the plan
(m3deploy.controller.certs.inventory: the cluster CA or CAs, the edge's, each host's internal ones, the user's own
edge certificate), each with its days left; a certificate inside the renewal window (m3_cert_renew_days; for the
CA, that plus m3_cert_validity_days, unless its rotation has begun), expired, or not strict X.509 fails, naming
what the next deploy does about it (or, for the user's own, the file to replace). `cert/served/<host>`: the
certificate each edge serves on its host's address (a handshake verified with the cluster's ca.pem, or
m3_tls_ca_file / the system store), its days left, the same rule."""
from __future__ import annotations

import datetime
import shlex
import socket
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


def _served(plan: ClusterPlan, address: str, port: int) -> Callable[[Context], str]:
    def fn(ctx: Context) -> str:
        from cryptography import x509

        try:
            with socket.create_connection((address, port), timeout=10) as raw, \
                    tls.client_context(plan).wrap_socket(raw, server_hostname=address) as s:
                der = s.getpeercert(binary_form=True)
        except OSError as e:  # ssl.SSLError included
            raise CheckFailed(f"TLS to {address}:{port}: {e}") from None
        c = x509.load_der_x509_certificate(der)
        left = int((c.not_valid_after_utc - datetime.datetime.now(datetime.timezone.utc)).total_seconds() // 86400)
        renew = tls.days(plan, "m3_cert_renew_days")
        said = (f"{address}:{port} serves {c.subject.rfc4514_string() or 'a certificate'} of "
                f"{c.issuer.rfc4514_string()}: {left} days left (not after {c.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ})")
        strict = tls.strict_problems(c)
        if left <= renew or (strict and certs.own_edge(plan)):
            why = f"inside the renewal window ({renew} days)" if left <= renew else "not strict: " + "; ".join(strict)
            raise CheckFailed(f"{said}, {why}. Fix: " + ("re-run the deploy" if certs.own_edge(plan) else
                                                         "replace m3_tls_cert_file, then re-run the deploy"))
        return said
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
    for h in plan.hosts:
        for s in h.services:
            if s.kind == "edge" and not (only_host and only_host != h.name):
                for p in (p for p in s.ports if p.name == "https"):  # (m3_vip's address: one of these edges)
                    out.append(Check(id=f"cert/served/{h.name}", group="cert", target=h.name,
                                     title=f"the edge's certificate on {p.address}:{p.port}: more days left than the "
                                           "renewal window", fn=_served(plan, p.address, p.port),
                                     reproduce=f"openssl s_client -connect {p.address}:{p.port} </dev/null "
                                               "2>/dev/null | openssl x509 -noout -dates -issuer"))
    return out
