"""Workload controllers beside the control plane, built from their Go modules: JobSet and
LeaderWorkerSet.

Each controller is built like the control plane (cached in ``~/.cache/phalanx/bin``): its module
is downloaded at a pinned version (``go mod download``, as the proxy refuses version lists) and
its ``main`` package built in the unpacked source. Started by ``LocalCluster`` when
``ControlPlaneOptions.controllers`` names it (``python -m deploy.local up --controllers jobset``),
after kube-controller-manager (JobSets make Jobs, whose pods the Job controller makes):

* its real CRDs, from the module (``config/components/crd/bases``);
* its webhooks, which it needs (defaulting and validation of its objects and of its pods; LWS's
  pod webhook writes the group labels),
  served on a loopback port with a self-signed certificate for 127.0.0.1 (``openssl``), and
  registered with ``url`` client configurations carrying that certificate as CA; internal
  certificate management and leader election off; the pod webhooks limited to the controller's
  own pods (its ``objectSelector``);
* health on a loopback port (``/readyz``), metrics off.
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from deploy.local.build import BuildTarget, Progress, bin_root, ensure_targets
from deploy.local.components import LOOPBACK, free_port

JSONDoc = dict[str, Any]


@dataclass(frozen=True)
class ControllerSpec:
    name: str
    module: str
    version: str
    config_api: str  # apiVersion of its Configuration file (kubebuilder controllers share its shape)
    crds: str  # folder of CRD files inside the module
    webhooks: str  # the webhook configurations file inside the module
    webhook_patches: tuple[str, ...] = ()  # JSON-patch files (kustomize patches) applied to it
    main: str = "."  # its main package, relative to the module


JOBSET = ControllerSpec(
    name="jobset",
    module="sigs.k8s.io/jobset",
    version="v0.10.1",
    config_api="config.jobset.x-k8s.io/v1alpha1",
    crds="config/components/crd/bases",
    webhooks="config/components/webhook/manifests.yaml",
    webhook_patches=(
        "config/components/webhook/patches/mutating-patch.yaml",
        "config/components/webhook/patches/validating-patch.yaml",
    ),
)
LWS = ControllerSpec(
    name="lws",
    module="sigs.k8s.io/lws",
    version="v0.7.0",
    config_api="config.lws.x-k8s.io/v1alpha1",
    crds="config/crd/bases",
    webhooks="config/webhook/manifests.yaml",
    webhook_patches=("config/webhook/mutating-patch.yaml", "config/webhook/validating-patch.yaml"),
    main="./cmd",
)
CONTROLLERS = {c.name: c for c in (JOBSET, LWS)}


def module_dir(spec: ControllerSpec) -> Path:
    """Download the module at its pinned version (cached) and return its unpacked source."""
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"{spec.module}@{spec.version}"], check=True, capture_output=True, text=True
    ).stdout
    return Path(json.loads(out)["Dir"])


def target(spec: ControllerSpec, source: Path) -> BuildTarget:
    build = ("go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w", "-o", f"{{out}}/{spec.name}", spec.main)
    return BuildTarget(spec.name, spec.version, (spec.name,), build, source, ())


def ensure(spec: ControllerSpec, progress: Progress = print) -> tuple[Path, Path]:
    """Build the controller if missing; return (binary, module source)."""
    source = module_dir(spec)
    built = target(spec, source)
    ensure_targets((built,), progress)
    return bin_root() / f"{spec.name}-{spec.version}" / spec.name, source


@dataclass(frozen=True)
class Prepared:
    argv: list[str]
    health_port: int


def serving_certificate(folder: Path) -> bytes:
    """A self-signed serving certificate for 127.0.0.1 in ``folder`` (tls.crt, tls.key); returns
    the certificate (the webhook configurations' CA)."""
    folder.mkdir(parents=True, exist_ok=True)
    crt, key = folder / "tls.crt", folder / "tls.key"
    if not crt.exists() or not key.exists():
        subprocess.run(
            [
                "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "365",
                "-keyout", str(key), "-out", str(crt), "-subj", f"/CN={LOOPBACK}",
                "-addext", f"subjectAltName=IP:{LOOPBACK}",
            ],
            check=True,
            capture_output=True,
        )  # fmt: skip
        key.chmod(0o600)
    return crt.read_bytes()


def prepare(
    spec: ControllerSpec,
    binary: Path,
    source: Path,
    *,
    state: Path,
    kubeconfig: Path,
    apply: Callable[[JSONDoc], None],
) -> Prepared:
    """Install the CRDs and webhook configurations; return the command line to start it."""
    home = state / spec.name
    ca = serving_certificate(home / "certs")
    webhook_port, health_port = free_port(), free_port()
    for path in sorted((source / spec.crds).glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                apply(doc)
    for doc in webhook_configurations(spec, source, f"https://{LOOPBACK}:{webhook_port}", ca):
        apply(doc)
    config = {
        "apiVersion": spec.config_api,
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": webhook_port, "host": LOOPBACK, "certDir": str(home / "certs")},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"{LOOPBACK}:{health_port}"},
    }
    (home / "config.yaml").write_text(yaml.safe_dump(config))
    argv = [str(binary), f"--kubeconfig={kubeconfig}", f"--config={home / 'config.yaml'}"]
    return Prepared(argv, health_port)


def webhook_configurations(spec: ControllerSpec, source: Path, base_url: str, ca: bytes) -> list[JSONDoc]:
    """The module's webhook configurations with its patches, named after the controller and
    pointed at ``base_url``."""
    docs = [d for d in yaml.safe_load_all((source / spec.webhooks).read_text()) if d]
    patches = [yaml.safe_load((source / p).read_text()) for p in spec.webhook_patches]
    bundle = base64.b64encode(ca).decode()
    for doc, patch in zip(docs, [*patches, *([None] * len(docs))], strict=False):
        for op in patch or ():
            if op.get("op") == "replace" and op["path"].startswith("/webhooks/"):
                doc["webhooks"][int(op["path"].rsplit("/", 1)[1])] = op["value"]
        doc["metadata"] = {"name": f"{spec.name}-{doc['metadata']['name']}"}
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": base_url + path, "caBundle": bundle}
    return docs
