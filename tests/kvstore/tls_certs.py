"""Certificates for the TLS tests, made with the `cryptography` package: a CA, etcd's
server certificate (127.0.0.1), a client certificate the CA signed (no CommonName: etcd's
JSON gateway refuses one with a CommonName under ``--client-cert-auth``), one with a
CommonName, and a second CA with a client certificate of its own (one etcd does not
trust)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)] if cn else [])


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Pair:
    crt, pem = path.with_suffix(".crt"), path.with_suffix(".key")
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    pem.chmod(0o600)
    return Pair(crt, pem)


def _cert(cn: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
          issuer_key: ec.EllipticCurvePrivateKey, *, ca: bool = False,
          server: bool = False) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    b = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(issuer)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        b = b.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
    else:
        # etcd's gateway dials etcd's gRPC side with the server's own certificate: it
        # needs client use too.
        usage = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH]
                                                     if server else [])
        b = b.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    if server:
        b = b.add_extension(x509.SubjectAlternativeName([
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False)
    return b.sign(issuer_key, hashes.SHA256())


@dataclass(frozen=True)
class TLSFiles:
    ca: Path
    server: Pair
    client: Pair
    #: A client certificate of the CA with a CommonName.
    named: Pair
    other_ca: Path
    #: A client certificate signed by the other CA.
    stranger: Pair


def make_tls_files(base: Path) -> TLSFiles:
    base.mkdir(parents=True, exist_ok=True)
    out: dict[str, Pair] = {}
    for ca_name in ("ca", "other-ca"):
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_cert = _cert(f"statewright test {ca_name}", ca_key, _name(f"statewright test {ca_name}"),
                        ca_key, ca=True)
        out[ca_name] = _write(base / ca_name, ca_cert, ca_key)
        issued = (("server", True), ("client", False), ("named", False)) if ca_name == "ca" \
            else (("stranger", False),)
        for name, server in issued:
            key = ec.generate_private_key(ec.SECP256R1())
            cn = {"server": "etcd-server", "client": ""}.get(name, f"statewright-{name}")
            out[name] = _write(base / name, _cert(cn, key, ca_cert.subject, ca_key,
                                                  server=server), key)
    return TLSFiles(out["ca"].cert, out["server"], out["client"], out["named"],
                    out["other-ca"].cert, out["stranger"])
