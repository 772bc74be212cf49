"""The user's own edge certificate (m3_tls_cert_file / m3_tls_key_file / m3_tls_ca_file) refused by `m3deploy
validate` (exit 2) before any host is touched, naming the key, the hosts that set it, the file it was set in, the
certificate file and the fix (m3deploy.controller.user_tls; issue 35). HAProxy 2.6 loads the chain and key from one
PEM: a pair that does not match fails its config check on every control host, an expired one goes live everywhere.

Every certificate here is made in the test with `cryptography` (no committed key).
"""
from __future__ import annotations

import datetime

import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from m3deploy.cli import main

NOW = datetime.datetime.now(datetime.timezone.utc)
INV = ('control = [("ctl", {"m3_address": "10.0.0.1"})]\n'
       'workers = [("w1", {"m3_address": "10.0.0.2"})]\n')
GD = ('m3_platform = "sim"\nm3_engine = "mocker"\nm3_serving = "dynamo"\nm3_parallel = "tp1"\nm3_edge = True\n')


def _name(cn):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def cert(cn, key, issuer=None, issuer_key=None, days=365, start_days=-1, ca=False):
    b = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(issuer.subject if issuer else _name(cn))
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(NOW + datetime.timedelta(days=start_days)).not_valid_after(NOW + datetime.timedelta(days=days))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    return b.sign(issuer_key or key, hashes.SHA256())


def pem(c) -> str:
    return c.public_bytes(serialization.Encoding.PEM).decode()


def key_pem(k, password=None) -> str:
    enc = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc).decode()


def new_key():
    return ec.generate_private_key(ec.SECP256R1())


@pytest.fixture
def pki(tmp_path):
    """A CA, an intermediate and an edge certificate signed by it, a year long; their files 0600."""
    ca_key, int_key, edge_key = new_key(), new_key(), new_key()
    ca = cert("test root", ca_key, ca=True, days=3650)
    inter = cert("test intermediate", int_key, ca, ca_key, ca=True, days=1000)
    edge = cert("edge.example", edge_key, inter, int_key)
    return {"dir": tmp_path, "ca": ca, "ca_key": ca_key, "inter": inter, "int_key": int_key, "edge": edge,
            "edge_key": edge_key}


def write(d, name, text, mode=0o600):
    p = d / name
    p.write_text(text)
    p.chmod(mode)
    return str(p)


def run_validate(tmp_path, extra: str, inv_text: str = INV, gd_text: str = GD):
    """`m3deploy validate` of inventories/c.py (`inv_text`) with group_data/all.py = `gd_text` + `extra`."""
    inv = tmp_path / "inventories" / "c.py"
    inv.parent.mkdir(parents=True, exist_ok=True)
    inv.write_text(inv_text)
    (tmp_path / "group_data").mkdir(exist_ok=True)
    (tmp_path / "group_data" / "all.py").write_text(gd_text + extra)
    return CliRunner().invoke(main, ["validate", str(inv)], catch_exceptions=False)


def files(pki, cert_text=None, key_text=None, ca_text=None, cert_mode=0o600, key_mode=0o600):
    d = pki["dir"]
    c = write(d, "edge.crt", pem(pki["edge"]) + pem(pki["inter"]) if cert_text is None else cert_text, cert_mode)
    k = write(d, "edge.key", key_pem(pki["edge_key"]) if key_text is None else key_text, key_mode)
    a = write(d, "ca.pem", pem(pki["ca"]) if ca_text is None else ca_text, 0o644)
    return c, k, a


def gd(c, k, a=None, **more) -> str:
    out = f"m3_tls_cert_file = {c!r}\nm3_tls_key_file = {k!r}\n" + (f"m3_tls_ca_file = {a!r}\n" if a else "")
    return out + "".join(f"{n} = {v!r}\n" for n, v in more.items())


def refused(tmp_path, extra, *must):
    r = run_validate(tmp_path, extra)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if all(m in ln for m in must)]
    assert lines, r.output
    ln = lines[0]
    assert "hosts ctl, w1 (" in ln and "group_data/all.py)" in ln and "Fix" in ln, ln  # hosts, file, fix
    assert "Traceback" not in r.output and "PRIVATE KEY" not in r.output
    return ln


def test_a_good_chain_key_and_ca_are_valid(tmp_path, pki):
    r = run_validate(tmp_path, gd(*files(pki)))
    assert r.exit_code == 0, r.output


def test_a_key_that_is_not_the_certificates_is_refused(tmp_path, pki):
    c, _, a = files(pki)
    other = write(pki["dir"], "other.key", key_pem(new_key()))
    ln = refused(tmp_path, gd(c, other, a), "key m3_tls_key_file", other, "not the private key", c)
    assert "CN=edge.example" in ln


def test_an_expired_certificate_is_refused(tmp_path, pki):
    old = cert("edge.example", pki["edge_key"], pki["inter"], pki["int_key"], days=-1, start_days=-400)
    c, k, a = files(pki, cert_text=pem(old) + pem(pki["inter"]))
    refused(tmp_path, gd(c, k, a), "key m3_tls_cert_file", c, "expired on")


def test_a_certificate_not_yet_valid_is_refused(tmp_path, pki):
    later = cert("edge.example", pki["edge_key"], pki["inter"], pki["int_key"], days=400, start_days=2)
    c, k, a = files(pki, cert_text=pem(later) + pem(pki["inter"]))
    refused(tmp_path, gd(c, k, a), "key m3_tls_cert_file", c, "not valid before")


def test_a_certificate_inside_the_renewal_window_is_refused(tmp_path, pki):
    soon = cert("edge.example", pki["edge_key"], pki["inter"], pki["int_key"], days=20)
    c, k, a = files(pki, cert_text=pem(soon) + pem(pki["inter"]))
    refused(tmp_path, gd(c, k, a), "key m3_tls_cert_file", c, "inside the renewal window", "m3_cert_renew_days = 30")
    # the window is the user's: 10 days lets the same certificate pass
    assert run_validate(tmp_path, gd(c, k, a, m3_cert_renew_days=10)).exit_code == 0


def test_a_chain_that_does_not_lead_to_the_ca_is_refused(tmp_path, pki):
    stranger = cert("someone else's root", new_key(), ca=True)
    c, k, a = files(pki, ca_text=pem(stranger))
    refused(tmp_path, gd(c, k, a), "key m3_tls_ca_file", a, "holds no CA that signed", c)


def test_a_chain_missing_its_intermediate_is_refused(tmp_path, pki):
    c, k, a = files(pki, cert_text=pem(pki["edge"]))  # the edge's certificate alone: the root did not sign it
    refused(tmp_path, gd(c, k, a), "key m3_tls_ca_file", "add the missing intermediate")


def test_a_chain_out_of_order_is_refused(tmp_path, pki):
    c, k, a = files(pki, cert_text=pem(pki["edge"]) + pem(pki["ca"]) + pem(pki["inter"]))
    refused(tmp_path, gd(c, k, a), "key m3_tls_cert_file", "not signed by the next one")


@pytest.mark.parametrize("which", ["cert", "key"])
def test_missing_files_are_refused(tmp_path, pki, which):
    c, k, a = files(pki)
    missing = str(pki["dir"] / "nope.pem")
    c, k = (missing, k) if which == "cert" else (c, missing)
    refused(tmp_path, gd(c, k, a), f"key m3_tls_{which}_file", missing, "does not exist on this controller")


def test_a_directory_is_refused_as_a_directory(tmp_path, pki):
    c, _, a = files(pki)
    refused(tmp_path, gd(c, str(pki["dir"]), a), "key m3_tls_key_file", "is a directory, not a file")


def test_a_world_readable_key_is_refused(tmp_path, pki):
    c, k, a = files(pki, key_mode=0o644)
    refused(tmp_path, gd(c, k, a), "key m3_tls_key_file", k, "can be read by others (mode 644", f"chmod 600 {k}")


def test_an_encrypted_key_is_refused(tmp_path, pki):
    c, k, a = files(pki, key_text=key_pem(pki["edge_key"], b"secret"))
    refused(tmp_path, gd(c, k, a), "key m3_tls_key_file", "is encrypted")


def test_not_pem_is_refused(tmp_path, pki):
    c, k, a = files(pki, cert_text="hello\n")
    refused(tmp_path, gd(c, k, a), "key m3_tls_cert_file", "is not PEM")


def test_the_deploy_refuses_the_same_before_any_host(tmp_path, pki):
    """deploy/context.cluster_plan checks the files before preparing the controller or touching a host."""
    from m3deploy.controller import user_tls
    from m3deploy.core.inventory import hosts_from_dict

    c, _, a = files(pki)
    other = write(pki["dir"], "other.key", key_pem(new_key()))
    hosts = hosts_from_dict({"control": [("ctl", {"m3_address": "10.0.0.1"})], "workers": [("w1", {})]},
                            all_data={"m3_tls_cert_file": c, "m3_tls_key_file": other, "m3_tls_ca_file": a})
    assert any("key m3_tls_key_file" in p and "not the private key" in p for p in user_tls.problems(hosts))
