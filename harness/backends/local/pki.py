"""Certificates for a local control plane: one CA, a serving cert, client certs, the SA signing key.

EC P-256 keys keep generation in milliseconds. Every component authenticates with a client cert
signed by the cluster CA, and every secure endpoint trusts that CA, so the admin kubeconfig's
credentials also open the scheduler's and controller-manager's /metrics.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=365)

# name of the client identity -> (common name, organisations)
CLIENTS = {
    "admin": ("dra-harness-admin", ["system:masters"]),
    "kube-scheduler": ("system:kube-scheduler", []),
    "kube-controller-manager": ("system:kube-controller-manager", []),
    "kwok": ("dra-harness-kwok", ["system:masters"]),
    # The API server's identity towards kubelets (logs, exec); the kubelet authorizes it by webhook.
    "kube-apiserver-kubelet-client": ("dra-harness-apiserver-kubelet-client", ["system:masters"]),
}


@dataclass(frozen=True)
class Pki:
    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.directory / "serving.crt"

    @property
    def serving_key(self) -> Path:
        return self.directory / "serving.key"

    @property
    def service_account_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def service_account_pub(self) -> Path:
        return self.directory / "sa.pub"

    def client_cert(self, name: str) -> Path:
        return self.directory / f"{name}.crt"

    def client_key(self, name: str) -> Path:
        return self.directory / f"{name}.key"


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _builder(subject: x509.Name, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALIDITY))


def _sign_client(pki: Pki, ca_key, ca_name: x509.Name, name: str, common_name: str, orgs: list[str]) -> None:
    key = _key()
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in orgs]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    cert = (_builder(x509.Name(attributes), ca_name, key.public_key())
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    _write_key(pki.client_key(name), key)
    _write_cert(pki.client_cert(name), cert)


def add_client(pki: Pki, name: str, common_name: str, orgs: list[str]) -> None:
    """Sign one more client certificate with the cluster's CA (e.g. a real node's kubelet)."""
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    ca_name = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes()).subject
    _sign_client(pki, ca_key, ca_name, name, common_name, orgs)


def create(directory: Path, cluster_name: str) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory)

    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"dra-harness-ca-{cluster_name}")])
    ca_cert = (_builder(ca_name, ca_name, ca_key.public_key())
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                            content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False,
                                            encipher_only=False, decipher_only=False), critical=True)
               .sign(ca_key, hashes.SHA256()))
    _write_key(pki.ca_key, ca_key)
    _write_cert(pki.ca_cert, ca_cert)

    # One serving cert for every component: they all listen on loopback only.
    serving_key = _key()
    names: list[x509.GeneralName] = [
        x509.DNSName(n) for n in ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                                  "kubernetes.default.svc.cluster.local")]
    names += [x509.IPAddress(ipaddress.ip_address(a)) for a in ("127.0.0.1", "::1", "10.96.0.1")]
    serving = (_builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dra-harness-serving")]), ca_name,
                        serving_key.public_key())
               .add_extension(x509.SubjectAlternativeName(names), critical=False)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
               .sign(ca_key, hashes.SHA256()))
    _write_key(pki.serving_key, serving_key)
    _write_cert(pki.serving_cert, serving)

    for name, (common_name, orgs) in CLIENTS.items():
        _sign_client(pki, ca_key, ca_name, name, common_name, orgs)

    sa_key = _key()
    _write_key(pki.service_account_key, sa_key)
    pki.service_account_pub.write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pki
