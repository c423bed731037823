"""Throw-away certificates for TLS tests, made with the openssl CLI (the project's Python
dependencies carry no crypto library): a CA, a server certificate for 127.0.0.1 and client
certificates it signs."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


def _run(*argv: str) -> None:
    subprocess.run(["openssl", *argv], check=True, capture_output=True)


def ca(folder: Path, name: str) -> Pair:
    pair = Pair(folder / f"{name}.crt", folder / f"{name}.key")
    _run(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
        "-keyout", str(pair.key), "-out", str(pair.cert),
    )  # fmt: skip
    return pair


def signed(folder: Path, name: str, by: Pair, *, server: bool = False) -> Pair:
    """A certificate for `name` signed by `by`: a server's for 127.0.0.1 and localhost, or a
    client's (CN = name)."""
    pair = Pair(folder / f"{name}.crt", folder / f"{name}.key")
    csr = folder / f"{name}.csr"
    _run(
        "req",
        "-new",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        f"/CN={name}",
        "-keyout",
        str(pair.key),
        "-out",
        str(csr),
    )
    extensions = folder / f"{name}.ext"
    usage = "serverAuth" if server else "clientAuth"
    alt = "\nsubjectAltName=IP:127.0.0.1,DNS:localhost" if server else ""
    extensions.write_text(f"extendedKeyUsage={usage}{alt}\n")
    _run(
        "x509", "-req", "-in", str(csr), "-CA", str(by.cert), "-CAkey", str(by.key), "-CAcreateserial",
        "-days", "2", "-extfile", str(extensions), "-out", str(pair.cert),
    )  # fmt: skip
    return pair
