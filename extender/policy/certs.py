"""The admission webhook's serving certificate: made by Phalanx, shared by its replicas, rotated
before it expires, trusted by the API server through the webhook configurations' `caBundle`.

Why generated here rather than by cert-manager: the webhooks must work on a bare cluster (the
local one, a first install), and the API server trusts whatever `caBundle` says, so the process
that serves the certificate is the one that knows which CA to put there. The scheme is
controller-runtime's cert-controller's:

- A Secret (`phalanx-webhook-tls` in the configuration namespace) holds a CA and a serving
  certificate it signed (`ca.crt`, `tls.crt`, `tls.key`), so every replica serves the same one.
  The first replica to find none creates it; a replica that loses the race (409) reads the
  winner's.
- The certificate is renewed when less than a third of its validity is left (`renew_fraction`).
  Renewal makes a new CA and certificate, and the Secret keeps the previous CA beside the new
  one (`ca.crt` holds both until the old certificate expires): the webhook configurations
  trust both, so a replica still serving the old certificate stays trusted until it has
  re-read the files.
- The certificate and key are written to files (atomically: a temporary file then a rename)
  that the TLS server re-reads when they change (`extender.tls.ServerTLS`), and only after the
  webhook configurations trust the new CA: the API server never meets a certificate whose CA
  its `caBundle` lacks.

RSA 2048 with SHA-256, subject alternative names for the service DNS names and, for the local
cluster's URL webhooks, 127.0.0.1.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import tempfile
from base64 import b64decode, b64encode
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from extender.kube import Kube

log = structlog.get_logger("phalanx.policy.certs")

SECRET_NAME = "phalanx-webhook-tls"
VALIDITY = dt.timedelta(days=365)
RENEW_FRACTION = 1 / 3  # renew when this much of the validity is left


@dataclass(frozen=True, slots=True)
class Bundle:
    """A serving certificate, its key and the CAs a client must trust (PEM)."""

    ca: bytes  # the current CA, then the previous one while certificates it signed may be served
    cert: bytes
    key: bytes

    def not_after(self) -> dt.datetime:
        return x509.load_pem_x509_certificate(self.cert).not_valid_after_utc

    def not_before(self) -> dt.datetime:
        return x509.load_pem_x509_certificate(self.cert).not_valid_before_utc

    def due(self, now: dt.datetime, renew_fraction: float = RENEW_FRACTION) -> bool:
        """Whether to renew: less than `renew_fraction` of the validity left (or none)."""
        start, end = self.not_before(), self.not_after()
        return now >= end - (end - start) * renew_fraction

    def covers(self, dns_names: Sequence[str], ips: Sequence[str]) -> bool:
        """Whether the certificate names every host the webhooks are called at."""
        cert = x509.load_pem_x509_certificate(self.cert)
        try:
            san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            return False
        names = set(san.get_values_for_type(x509.DNSName))
        addresses = {str(a) for a in san.get_values_for_type(x509.IPAddress)}
        return set(dns_names) <= names and set(ips) <= addresses


def issue(
    dns_names: Sequence[str],
    ips: Sequence[str],
    *,
    now: dt.datetime | None = None,
    validity: dt.timedelta = VALIDITY,
    previous: Bundle | None = None,
) -> Bundle:
    """A new CA and a serving certificate it signs for `dns_names` and `ips`. The previous CA is
    kept in the bundle while the previous certificate is still valid."""
    now = now or dt.datetime.now(dt.UTC)
    start = now - dt.timedelta(minutes=5)  # clocks of API server replicas differ a little
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    # A name of its own per CA (and key identifiers): a client holding the old and the new CA
    # picks the one that signed what it is shown.
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"phalanx-webhook-ca-{os.urandom(6).hex()}")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
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
        .sign(ca_key, hashes.SHA256())
    )
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    alt: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    alt += [x509.IPAddress(ipaddress.ip_address(a)) for a in ips]
    cn = dns_names[0] if dns_names else (ips[0] if ips else "phalanx-webhook")
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(now + validity)
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    if previous is not None and previous.not_after() > now:
        ca_pem += _first_pem(previous.ca)
    return Bundle(
        ca=ca_pem,
        cert=cert.public_bytes(serialization.Encoding.PEM),
        key=key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )


def _first_pem(pem: bytes) -> bytes:
    """The first certificate of a PEM bundle (the CA that signed the bundle's certificate)."""
    end = b"-----END CERTIFICATE-----"
    cut = pem.find(end)
    return pem[: cut + len(end)] + b"\n" if cut >= 0 else b""


def to_secret_data(bundle: Bundle) -> dict[str, str]:
    return {
        k: b64encode(v).decode() for k, v in (("ca.crt", bundle.ca), ("tls.crt", bundle.cert), ("tls.key", bundle.key))
    }


def from_secret_data(data: dict[str, str] | None) -> Bundle | None:
    """The bundle a Secret holds, or None when it holds none that parses."""
    try:
        raw = {k: b64decode((data or {})[k]) for k in ("ca.crt", "tls.crt", "tls.key")}
        bundle = Bundle(raw["ca.crt"], raw["tls.crt"], raw["tls.key"])
        bundle.not_after()  # parses
        serialization.load_pem_private_key(bundle.key, password=None)
    except (KeyError, ValueError, TypeError):
        return None
    return bundle


class WebhookCerts:
    """Keeps the shared Secret current and this replica's certificate files in step with it."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        directory: Path,
        *,
        dns_names: Sequence[str] = (),
        ips: Sequence[str] = (),
        secret: str = SECRET_NAME,
        validity: dt.timedelta = VALIDITY,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.directory = directory
        self.dns_names = tuple(dns_names)
        self.ips = tuple(ips)
        self.secret = secret
        self.validity = validity
        self.bundle: Bundle | None = None

    @property
    def cert_file(self) -> Path:
        return self.directory / "tls.crt"

    @property
    def key_file(self) -> Path:
        return self.directory / "tls.key"

    def ensure(self, now: dt.datetime | None = None) -> Bundle:
        """The current bundle: the Secret's, renewed first when it is due, missing, unreadable
        or does not name our hosts. Not yet served: `install` it once the webhook
        configurations trust its CA. Raises OSError (and urllib3's errors) when the API server
        cannot be reached (the caller retries)."""
        clock = dt.datetime.now(dt.UTC)
        now = now or clock  # judged at `now` (a test's later time); issued at the real one
        path = f"/api/v1/namespaces/{self.namespace}/secrets/{self.secret}"
        r = self.kube.request("GET", path)
        current = from_secret_data(r.body.get("data")) if r.status == 200 and isinstance(r.body, dict) else None
        if current is None or current.due(now) or not current.covers(self.dns_names, self.ips):
            fresh = issue(self.dns_names, self.ips, now=clock, validity=self.validity, previous=current)
            body: dict[str, Any] = {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "kubernetes.io/tls",
                "metadata": {"name": self.secret, "namespace": self.namespace, "labels": {"app": "phalanx"}},
                "data": to_secret_data(fresh),
            }
            if r.status == 200:
                body["metadata"]["resourceVersion"] = r.body["metadata"]["resourceVersion"]
                w = self.kube.request("PUT", path, body=body)
            else:
                w = self.kube.request("POST", f"/api/v1/namespaces/{self.namespace}/secrets", body=body)
            if w.status in (200, 201):
                log.info("webhook certificate issued", secret=self.secret, not_after=str(fresh.not_after()))
                current = fresh
            elif w.status == 409:  # another replica wrote it first: take theirs
                again = self.kube.request("GET", path)
                current = from_secret_data(again.body.get("data")) if again.status == 200 else None
            if current is None:
                raise OSError(f"secret {self.namespace}/{self.secret}: cannot store the webhook certificate: {w.body}")
        return current

    def install(self, bundle: Bundle) -> None:
        """Serve `bundle`: its certificate and key to the files the TLS server re-reads."""
        if bundle == self.bundle:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        # The key first: the server re-reads when either changes and loads them as a pair.
        for target, data in ((self.key_file, bundle.key), (self.cert_file, bundle.cert)):
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{target.name}.")
            try:
                os.fchmod(fd, 0o600)
                os.write(fd, data)
            finally:
                os.close(fd)
            os.replace(tmp, target)
        self.bundle = bundle
