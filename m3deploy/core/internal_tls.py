"""TLS with client certificates inside the cluster (m3_internal_tls): etcd and NATS, from the cluster CA.

Pure plan data, no I/O. With m3_internal_tls (Dynamo with a control group) the plan
- serves etcd over https with `--client-cert-auth` and `--peer-client-cert-auth` (Debian's etcd-server 3.4
  flags, checked in its `--help`): clients and peers must show a certificate of the cluster CA. Its /health moves
  to a plain-HTTP metrics listener (`--listen-metrics-urls http://IP:2381`: /health and /metrics only, no key
  space), which the controller's readiness polling and verify read without a certificate;
- gives each NATS node a `tls { verify: true }` block for clients and one for its routes (nats.conf.j2): a client
  or route without a certificate of the CA is refused (nats-server 2.9 `--tlsverify`). Its monitor port (8222:
  /healthz, /varz) stays plain HTTP on the cluster address;
- gives every Dynamo process (frontend, workers) the CA, a client certificate and its key: NATS_TLS_CA_CERT_PATH /
  NATS_TLS_CLIENT_CERT_PATH / NATS_TLS_CLIENT_KEY_PATH (paths: dynamo/common/configuration/groups/runtime_args.py
  `--nats-tls-*` sets the same names) with NATS_SERVER `tls://...` (the runtime refuses TLS settings with a
  `nats://` URL: "NATS TLS is configured ... but NATS_SERVER does not use the 'tls://' scheme"), and
  ETCD_AUTH_CA / ETCD_AUTH_CLIENT_CERT / ETCD_AUTH_CLIENT_KEY (names from the strings of the runtime,
  dynamo/_core.abi3.so), which 1.6.1 reads as PEM *text*: the unit starts the process through LAUNCHER
  (files/m3-tls-env), which exports the files' text (`launcher`); ETCD_ENDPOINTS become https URLs;
- writes the files as Service.secret_files (TLS_DIR/<service>.crt, .key, -ca.crt; 0600, owned by the user the
  service runs as: `owner`): their text comes from the controller's store (m3deploy.controller.tls.cluster_certs),
  never from the plan. Each host has one certificate per identity (`etcd`, `nats`: server and client, naming the
  host's address; `client`: the Dynamo processes'), signed by the same cluster CA as the edge's.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from m3deploy.core import catalog
from m3deploy.core.inputs import url_host
from m3deploy.core.model import Service

TLS_DIR = "/etc/m3/tls"
ETCD_METRICS = 2381  # etcd's plain-HTTP /health and /metrics (no key space) beside its https client port
CA_REF = "cluster-ca-cert"  # the store's entry (m3deploy.controller.tls.CA_CERT)
LAUNCHER = "/usr/local/lib/m3/m3-tls-env"  # files/m3-tls-env: exports ETCD_AUTH_* from the files, then execs
NATS_ENV = {"ca": "NATS_TLS_CA_CERT_PATH", "crt": "NATS_TLS_CLIENT_CERT_PATH", "key": "NATS_TLS_CLIENT_KEY_PATH"}
ETCD_ENV = ("ETCD_AUTH_CA", "ETCD_AUTH_CLIENT_CERT", "ETCD_AUTH_CLIENT_KEY")  # PEM text, set by LAUNCHER
# the same files for our own etcd clients (files/m3-unregister-dead.py), as paths
FILE_ENV = {"ca": "M3_ETCD_CA_FILE", "crt": "M3_ETCD_CERT_FILE", "key": "M3_ETCD_KEY_FILE"}
# Dynamo 1.6.1 takes ETCD_AUTH_CA/... only without ETCD_AUTH_USERNAME: with a user set it ignores them and the
# handshake fails ("unknown certificate authority"; tried on this machine). So with TLS a Dynamo client logs in to
# etcd by its certificate: etcd 3.4 with --client-cert-auth and auth on takes a certificate's CommonName as the user
# when a request has no token. The `client` certificate names the Dynamo user (core.build.AUTH_USER); our scripts
# talk to etcd's JSON gateway, which answers 400 to any certificate with a CommonName ("CommonName of client
# sending a request against gateway will be ignored and not used as expected"): they show a `gateway` one, without
# CommonName, and log in with the password (files/m3-unregister-dead.py).
# etcd's peer port takes only etcd's own peer certificate: `--peer-cert-allowed-cn PEER_CN` (etcd 3.4 checks the
# CommonName of an incoming peer's certificate in the TLS handshake), and only the `peer` identity has that name;
# every other certificate of the cluster CA (a worker's `client`, the `gateway`, NATS's) is refused there (issue 35:
# a worker's client certificate got `GET /members` 200 on 2380). A separate leaf, so that etcd's client-port
# certificate keeps no CommonName (its gRPC gateway dials etcd with it).
PEER_CN = "m3-etcd-peer"
COMMON_NAME = {"client": "m3", "peer": PEER_CN}
ETCD_LOGIN_ENV = {"ETCD_AUTH_USERNAME": "M3_ETCD_USER", "ETCD_AUTH_PASSWORD": "M3_ETCD_PASSWORD"}


def enabled(s: Mapping[str, Any]) -> bool:
    return bool(s.get("m3_internal_tls")) and s.get("m3_serving") == "dynamo"


def scheme(s: Mapping[str, Any]) -> str:
    """etcd's client URL scheme."""
    return "https" if enabled(s) else "http"


def cert_ref(host: str, who: str) -> str:
    return f"tls-cert:{host}:{who}"


def key_ref(host: str, who: str) -> str:
    return f"tls-key:{host}:{who}"


def is_tls_ref(ref: str) -> bool:
    return ref == CA_REF or ref.startswith(("tls-cert:", "tls-key:"))


def common_name(who: str) -> str:
    return COMMON_NAME.get(who, "")


def paths(s: Service, who: str = "") -> dict[str, str]:
    return paths_of(s.name, who)


def paths_of(name: str, who: str = "") -> dict[str, str]:
    """The TLS files of service `name`: its CA, and the certificate and key of identity `who` (a `gateway` or
    `peer` one has its own names; every other identity the service's)."""
    n = f"{name}-{who}" if who in OWN_FILES else name
    return {"ca": f"{TLS_DIR}/{name}-ca.crt", "crt": f"{TLS_DIR}/{n}.crt", "key": f"{TLS_DIR}/{n}.key"}


OWN_FILES = ("gateway", "peer")  # identities beside a service's own: their files are named after them


def files(name: str, host: str, who: str) -> tuple[tuple[str, str], ...]:
    """(path, secret ref) of service `name`'s TLS files for identity `who` (Service.secret_files)."""
    p = paths_of(name, who)
    return (((p["ca"], CA_REF),) if who not in OWN_FILES else ()) + (
        (p["crt"], cert_ref(host, who)), (p["key"], key_ref(host, who)))


def etcd_files(name: str, host: str) -> tuple[tuple[str, str], ...]:
    """etcd's TLS files: its client-port certificate (`etcd`) and its peer certificate (`peer`, PEER_CN)."""
    return files(name, host, "etcd") + files(name, host, "peer")


def etcd_flags(name: str, address: str) -> tuple[str, ...]:
    """etcd's TLS flags (clients show a certificate of the cluster CA; peers the peer certificate, PEER_CN) and its
    plain metrics listener."""
    p, peer = paths_of(name), paths_of(name, "peer")
    return ("--cert-file", p["crt"], "--key-file", p["key"], "--trusted-ca-file", p["ca"], "--client-cert-auth",
            "--peer-cert-file", peer["crt"], "--peer-key-file", peer["key"], "--peer-trusted-ca-file", p["ca"],
            "--peer-client-cert-auth", "--peer-cert-allowed-cn", PEER_CN,
            "--cipher-suites", ",".join(catalog.tls_profile()["go"]),  # data/tls.yaml (TLS 1.2: etcd 3.4's minimum)
            "--listen-metrics-urls", f"http://{url_host(address)}:{ETCD_METRICS}")


def etcd_login_env(name: str) -> tuple[tuple[str, str], ...]:
    """The auth script's client files (files/m3-etcd-auth.py logs in to etcd as a client)."""
    p = paths_of(name)
    return (("M3_ETCD_CA", p["ca"]), ("M3_ETCD_CERT", p["crt"]), ("M3_ETCD_KEY", p["key"]))


def login_name(env_name: str, tls: bool) -> str:
    """A Dynamo client's etcd login variable: with TLS, our scripts' name (Dynamo then logs in by certificate)."""
    return ETCD_LOGIN_ENV.get(env_name, env_name) if tls else env_name


def client_scheme(tls: bool) -> str:
    """NATS_SERVER's scheme: the runtime refuses TLS settings with a `nats://` URL."""
    return "tls" if tls else "nats"


def client_env(name: str) -> tuple[tuple[str, str], ...]:
    """A Dynamo client's TLS env beside its others: the NATS client files (paths), then our own etcd clients'."""
    p, gw = paths_of(name), paths_of(name, "gateway")
    return tuple((env, p[kind]) for kind, env in NATS_ENV.items()) + tuple(
        (env, gw[kind]) for kind, env in FILE_ENV.items())


def client_files(name: str, host: str) -> tuple[tuple[str, str], ...]:
    return files(name, host, "client") + files(name, host, "gateway")


def client_docker(image: str | None) -> tuple[str, ...]:
    """A container client: the TLS directory read-only and the PEM variables LAUNCHER exports passed in."""
    return (("-v", f"{TLS_DIR}:{TLS_DIR}:ro") + tuple(a for n in ETCD_ENV for a in ("-e", n))) if image else ()


def client_launcher(name: str) -> tuple[str, ...]:
    """What a Dynamo client's ExecStart starts with: LAUNCHER and its three files."""
    p = paths_of(name)
    return (LAUNCHER, p["ca"], p["crt"], p["key"])


def nats_tls(s: Service) -> dict[str, Any] | None:
    """nats.conf's tls blocks (nats.conf.j2): the files and the profile's TLS 1.2 suites (data/tls.yaml; NATS 2.9's
    minimum is TLS 1.2), or None without m3_internal_tls."""
    return {**paths(s), "cipher_suites": catalog.tls_profile()["go"]} if s.tls else None


def problems(s: Mapping[str, Any], n_control: int) -> list[str]:
    if s.get("m3_internal_tls") and (s.get("m3_serving") != "dynamo" or not n_control):
        return ["key m3_internal_tls: TLS for etcd and NATS, which run on the control hosts of a Dynamo cluster. "
                "Fix: m3_serving = 'dynamo' with a control group, or remove m3_internal_tls"]
    return []



def lifetime_problems(s: Mapping[str, Any]) -> list[str]:
    """The cluster CA's lifetime settings (m3deploy.controller.certs): a new CA must outlast its rotation window."""
    ca, renew, leaf = (int(s[k]) for k in ("m3_ca_validity_days", "m3_cert_renew_days", "m3_cert_validity_days"))
    if ca <= renew + leaf:
        return [f"key m3_ca_validity_days: {ca} days: a new cluster CA would start its rotation at once (it rotates "
                f"with m3_cert_renew_days + m3_cert_validity_days = {renew + leaf} days left). Fix: "
                f"m3_ca_validity_days above {renew + leaf}, or a shorter m3_cert_validity_days"]
    return []
