"""The local API server's TLS: a CA made at start and a server certificate it signs for
127.0.0.1 and localhost.

Why TLS on loopback: kubectl (client-go) sends a kubeconfig's bearer token only over HTTPS, so
without it every kubectl command against the local cluster is refused. The kubeconfig carries
the CA (``certificate-authority-data``), as a real cluster's does; nothing is added to any trust
store. The keys are ECDSA P-256: generating them takes a millisecond, RSA takes tens.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import tempfile
from dataclasses import dataclass

#: Long enough for any local session; a cluster started again makes new ones.
VALIDITY = datetime.timedelta(days=30)
#: The names the server answers to (its URL uses the IP; "localhost" for hand-written configs).
SERVER_IP = "127.0.0.1"
SERVER_DNS = "localhost"


@dataclass(frozen=True)
class ServerCredentials:
    """PEM bytes: the CA clients trust, and the server's certificate and key."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    def server_context(self) -> ssl.SSLContext:
        """An SSL context that serves the certificate (TLS 1.2+)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # The ssl module loads keys from files only: a private directory, removed at once.
        with tempfile.TemporaryDirectory(prefix="nemo-kubeflow-tls-") as directory:
            cert, key = os.path.join(directory, "server.crt"), os.path.join(directory, "server.key")
            with open(cert, "wb") as f:
                f.write(self.cert_pem)
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(self.key_pem)
            context.load_cert_chain(cert, key)
        return context

    def client_context(self) -> ssl.SSLContext:
        """An SSL context that trusts this CA only (for raw HTTPS clients, e.g. tests)."""
        return ssl.create_default_context(cadata=self.ca_pem.decode())


def make_credentials(server_name: str = "nemo-kubeflow-local-apiserver") -> ServerCredentials:
    """A new CA and a server certificate (common name ``server_name``) for 127.0.0.1 and localhost,
    signed by it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    not_before, not_after = now - datetime.timedelta(minutes=5), now + VALIDITY  # some clock skew

    def name(common_name: str) -> x509.Name:
        return x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "nemo-kubeflow local cluster"),
                x509.NameAttribute(NameOID.COMMON_NAME, common_name),
            ]
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = name("nemo-kubeflow-local-ca")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name(server_name))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=False,
                crl_sign=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(SERVER_IP)), x509.DNSName(SERVER_DNS)]),
            critical=False,
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    pem = serialization.Encoding.PEM
    return ServerCredentials(
        ca_pem=ca.public_bytes(pem),
        cert_pem=cert.public_bytes(pem),
        key_pem=key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
