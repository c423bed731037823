"""Credentials of the local control plane: the service-account key, static tokens, kubeconfigs.

* One RSA key serves both ``--service-account-key-file`` (verify) and
  ``--service-account-signing-key-file`` (sign); it is made with the ``openssl`` CLI because the
  project's Python dependencies carry no crypto library.
* Clients authenticate with static bearer tokens (``--token-auth-file``). Every component and
  the admin are in ``system:masters``: this is a throw-away test cluster, and RBAC for alpha
  APIs (Workload, PodGroup) must not be what a test trips over.
* The API server's serving certificate is self-signed by kube-apiserver into ``--cert-dir``;
  that file bundles the signing CA, so kubeconfigs name it as ``certificate-authority`` and
  clients verify TLS (no ``insecure-skip-tls-verify``, no urllib3 warnings).
"""

from __future__ import annotations

import csv
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ADMIN_GROUP = "system:masters"


@dataclass(frozen=True)
class Identity:
    """A static-token client: user name, token and the kubeconfig written for it."""

    user: str
    token: str


@dataclass(frozen=True)
class Tokens:
    """The tokens of the admin (tests, benchmarks, extender), kube-scheduler and KWOK."""

    admin: Identity
    scheduler: Identity
    kwok: Identity

    def all(self) -> tuple[Identity, ...]:
        return (self.admin, self.scheduler, self.kwok)


def ensure_service_account_key(path: Path) -> Path:
    """Create the RSA service-account key at ``path`` unless it exists; return the path."""
    if path.is_file():
        return path
    if shutil.which("openssl") is None:
        raise RuntimeError("openssl is needed to create the service-account key (apt install openssl)")
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["openssl", "genrsa", "-out", str(path), "2048"], check=True, capture_output=True)
    path.chmod(0o600)
    return path


def ensure_tokens(path: Path) -> Tokens:
    """Read the token file at ``path``, creating it with fresh random tokens if absent.

    The file uses kube-apiserver's ``token,user,uid,"group1,group2"`` CSV format.
    """
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        users = ("admin", "system:kube-scheduler", "kwok-controller")
        with open(path, "w", newline="") as out:
            writer = csv.writer(out)
            for user in users:
                writer.writerow([secrets.token_hex(24), user, user, ADMIN_GROUP])
        path.chmod(0o600)
    with open(path, newline="") as source:
        rows = [Identity(user=row[1], token=row[0]) for row in csv.reader(source) if row]
    return Tokens(admin=rows[0], scheduler=rows[1], kwok=rows[2])


def kubeconfig(server: str, ca_file: Path, identity: Identity, cluster_name: str = "phalanx") -> dict[str, Any]:
    """Return a kubeconfig dict for ``identity`` against ``server``, verifying with ``ca_file``."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster_name,
                "cluster": {
                    "server": server,
                    "certificate-authority": str(ca_file),
                },
            }
        ],
        "users": [{"name": identity.user, "user": {"token": identity.token}}],
        "contexts": [
            {
                "name": cluster_name,
                "context": {
                    "cluster": cluster_name,
                    "user": identity.user,
                    "namespace": "default",
                },
            }
        ],
        "current-context": cluster_name,
    }


def write_kubeconfig(path: Path, config: dict[str, Any]) -> Path:
    """Write ``config`` to ``path`` readable by the owner only; return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
