"""Certificates over the cluster's life (issue 35): every certificate a plan uses, its dates, its renewal and the
cluster CA's rotation (docs/OPERATIONS.md "Certificates over the cluster's life").

- `inventory(plan)`: what the controller's store holds for the plan (the CA or CAs, the edge's certificate, each
  host's internal ones) and the user's own edge certificate (m3_tls_cert_file): name, hosts, not-after, days left,
  issuer, what RFC 5280 strictness misses. Read only: `m3deploy certs` and verify's `cert/...` checks.
- `renew(plan)`: the deploy calls it once, before any host (m3deploy.deploy.context): one step of the CA's rotation
  when one is due, then every certificate of the plan that has `m3_cert_renew_days` or fewer left, is not strict or
  is not of the signing CA is dropped from the store, so that m3deploy.controller.tls makes it again in the same
  run; the files change, and each component's own lifecycle rolls them out (etcd and NATS restarted, frontends
  drained at every edge, workers rolled, the edge reloaded).
- The CA's rotation, one step per deploy, each step only once the last one reached every host (the deploy record
  of each host with TLS files is newer than the step): 1. a new CA is made and trusted beside the old one (the
  trust bundle, `<config>/<cluster>/ca.pem` and every `-ca.crt`, holds both; certificates are not changed);
  2. the new CA signs: every certificate is re-issued by it, the old CA still trusted; 3. the old CA is dropped
  from the bundle. It starts when the CA has fewer than m3_cert_renew_days + m3_cert_validity_days left (it can no
  longer sign a whole certificate that ends before it does), or is not strict X.509 (made before issue 35).
"""
from __future__ import annotations

import datetime
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from m3deploy.controller import deployed, tls
from m3deploy.controller import secrets as store
from m3deploy.controller.cachelock import locked
from m3deploy.core import internal_tls

STEP_AT = "cluster-ca-step-at"  # when the CA's rotation took its last step (UTC, the deploy record's format)
CA_ROLES = {tls.CA_CERT: "ca", tls.NEXT_CERT: "ca-next", tls.PREV_CERT: "ca-previous"}


@dataclass(frozen=True)
class Cert:
    name: str  # "cluster CA", "edge", "<host> etcd", ...
    source: str  # the store's entry, or the user's file
    role: str  # ca | ca-next | ca-previous | server | peer | client
    hosts: tuple[str, ...]
    subject: str
    issuer: str
    not_after: str  # ISO 8601, UTC
    days_left: int
    strict: tuple[str, ...]  # what strict X.509 misses (tls.strict_problems); () when strict
    renewed_by_deploy: bool  # False: the user's own (m3_tls_cert_file): replace the file

    def to_dict(self) -> dict:
        return {**asdict(self), "hosts": list(self.hosts), "strict": list(self.strict)}


def _days_left(cert, now: datetime.datetime) -> int:
    return int((cert.not_valid_after_utc - now).total_seconds() // 86400)


def _cert(name, source, role, hosts, pem: str, now, ours=True) -> Cert:
    c = tls.load_cert(pem)
    return Cert(name, source, role, tuple(hosts), c.subject.rfc4514_string(), c.issuer.rfc4514_string(),
                c.not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ"), _days_left(c, now),
                tuple(tls.strict_problems(c)), ours)


def own_edge(plan) -> bool:
    """Does the plan's edge serve a certificate of the cluster CA (not the user's m3_tls_cert_file)?"""
    return bool(tls.edge_names(plan)) and not dict(plan.settings).get("m3_tls_cert_file")


def _edge_hosts(plan) -> tuple[str, ...]:
    return tuple(h.name for h in plan.hosts if any(s.kind == "edge" for s in h.services))


def inventory(plan, data: dict | None = None, now: datetime.datetime | None = None) -> list[Cert]:
    """Every certificate the plan uses that the controller can see, without making any."""
    data = store.load_secrets(plan.name) if data is None else data
    now = now or tls.now_utc()
    out = []
    uses_ca = bool(tls.wanted(plan)) or own_edge(plan)
    hosts = tuple(sorted({h.name for h in plan.hosts if _tls_host(h)} | set(_edge_hosts(plan))))
    for ref, role in CA_ROLES.items():
        if uses_ca and ref in data:
            label = {"ca": "cluster CA", "ca-next": "cluster CA (next)", "ca-previous": "cluster CA (previous)"}[role]
            out.append(_cert(label, ref, role, hosts, data[ref], now))
    if own_edge(plan) and tls.EDGE_CERT in data:
        out.append(_cert("edge", tls.EDGE_CERT, "server", _edge_hosts(plan), data[tls.EDGE_CERT], now))
    user = dict(plan.settings).get("m3_tls_cert_file")
    if user and tls.edge_names(plan) and Path(user).expanduser().is_file():
        text = Path(user).expanduser().read_text()
        if "-----BEGIN CERTIFICATE-----" in text:  # the first certificate of the chain: the edge's own
            out.append(_cert("edge (m3_tls_cert_file)", str(Path(user).expanduser()), "server", _edge_hosts(plan),
                             text, now, ours=False))
    for name, (_, who) in sorted(tls.wanted(plan).items()):
        ref = internal_tls.cert_ref(*name.rsplit(":", 1))
        if ref in data:
            host = name.rsplit(":", 1)[0]
            out.append(_cert(f"{host} {who}", ref, tls.role(who), (host,), data[ref], now))
    return out


def _tls_host(h) -> bool:
    return any(internal_tls.is_tls_ref(r) for s in h.services for _, r in s.secret_files)


def window(plan, c: Cert) -> int:
    """The days left at or under which `c` is due: m3_cert_renew_days, and for the CA that plus a whole
    certificate's validity."""
    renew = tls.days(plan, "m3_cert_renew_days")
    return renew + tls.days(plan, "m3_cert_validity_days") if c.role == "ca" else renew


def due(plan, c: Cert, data: dict) -> str:
    """Why `c` needs renewing (a re-run does it; the user's own: replace the file), or ""."""
    if c.role in ("ca-next", "ca-previous"):
        return "expired" if c.days_left < 0 else ""
    if c.strict:
        return "not strict X.509: " + "; ".join(c.strict)
    if c.days_left <= window(plan, c):
        if c.role == "ca" and tls.NEXT_CERT in data:
            return ""  # its rotation has begun
        return f"{c.days_left} days left, inside the renewal window ({window(plan, c)} days)"
    return ""


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _shipped(plan, data: dict) -> bool:
    """Did the CA's last step reach every host with TLS files (its deploy record, written at the end of a deploy, is
    newer than the step, taken at its start)?"""
    at = data.get(STEP_AT, "")
    rec = deployed.load(plan.name).get("hosts") or {}
    return all((rec.get(h.name) or {}).get("at", "") > at for h in plan.hosts if _tls_host(h))


def _ca_step(plan, data: dict) -> str:
    """One step of the CA's rotation, when one is due (module docstring); what it did, or ""."""
    if tls.NEXT_CERT in data or tls.PREV_CERT in data:
        if not _shipped(plan, data):
            return ("CA rotation: the last step has not reached every host (no deploy record since "
                    f"{data.get(STEP_AT)}): this run deploys it again")
        if tls.NEXT_CERT in data:
            data[tls.PREV_CERT] = data[tls.CA_CERT]
            data[tls.CA_KEY], data[tls.CA_CERT] = data.pop(tls.NEXT_KEY), data.pop(tls.NEXT_CERT)
            msg = "CA rotation step 2 of 3: the new CA signs; every certificate re-issued by it (old CA still trusted)"
        else:
            data.pop(tls.PREV_CERT)
            msg = "CA rotation step 3 of 3: the previous CA dropped from the trust bundle"
    else:
        ca = _cert("cluster CA", tls.CA_CERT, "ca", (), data[tls.CA_CERT], tls.now_utc())
        why = due(plan, ca, data)
        if not why:
            return ""
        data[tls.NEXT_KEY], data[tls.NEXT_CERT] = tls.new_ca(plan.name, tls.days(plan, "m3_ca_validity_days"))
        msg = (f"CA rotation step 1 of 3 ({why}): a new CA trusted beside the old one; give clients the new "
               f"{tls.ca_path(plan) or 'ca.pem'} before the next deploy")
    data[STEP_AT] = _stamp()
    return msg


def renew(plan) -> list[str]:
    """Before any host: one step of the CA's rotation, then every due certificate of the plan dropped from the
    store and made again (module docstring). Returns what it did, for the deploy's log."""
    if not (tls.wanted(plan) or own_edge(plan)):
        return []
    notes = []
    path = store.secrets_path(plan.name)
    if path.is_file():  # (a new cluster: everything is made below, nothing is due)
        with locked(path, f"the secrets store of {plan.name}"):
            data = store.load_secrets(plan.name)
            step = _ca_step(plan, data) if tls.CA_CERT in data else ""
            notes += [step] if step else []
            for c in inventory(plan, data):
                if c.role in ("server", "peer", "client") and c.renewed_by_deploy:
                    why = due(plan, c, data) or ("" if tls.by_ca(data, c.source) else "not of the signing CA")
                    if why:
                        data.pop(c.source)
                        data.pop(c.source.replace("-cert", "-key", 1), None)  # tls-cert:... / edge-tls-cert
                        notes.append(f"re-issue {c.name} ({why})")
            store.write_secrets(plan.name, data)
    tls.ensure_cluster_tls(plan)
    tls.cluster_certs(plan)
    tls.ca_file(plan)  # ca.pem: the trust bundle
    return notes
