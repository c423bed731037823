"""Workload controllers beside the control plane, built from their Go modules: JobSet,
LeaderWorkerSet, Kubeflow Trainer, the Kubeflow training-operator (PyTorchJob), the MPI
operator, KubeRay and KServe.

Each controller is built like the control plane (cached in ``~/.cache/phalanx/bin``): its module
is downloaded at a pinned version (``go mod download``, as the proxy refuses version lists) and
its ``main`` package built in the unpacked source. Two of them hard-code what a shared machine
cannot give them, and are built from a patched copy of their source (the module cache is
never written):

* the MPI operator serves its health check on the fixed port 8080; the patch reads the
  address from ``HEALTH_PROBE_BIND_ADDRESS``;
* the training-operator generates its webhook certificate for an in-cluster Service name, in
  ``/tmp``, from a Secret; the patch skips that rotation, and the certificate below is used.

Started by ``LocalCluster`` when ``ControlPlaneOptions.controllers`` names it
(``python -m deploy.local up --controllers jobset,trainer``), after kube-controller-manager (a
JobSet makes Jobs, whose pods the Job controller makes) and after the controllers it needs
(Trainer makes JobSets):

* its real CRDs, from the module;
* its webhooks where it has them (defaulting and validation of its objects and of its pods;
  LWS's pod webhook writes the group labels), served on a loopback port with a self-signed
  certificate for 127.0.0.1 (``openssl``), and registered with ``url`` client configurations
  carrying that certificate as CA; internal certificate management and leader election off
  (the MPI operator always elects: its lock lives in kube-system); the pod webhooks limited to
  the controller's own pods (its ``objectSelector``);
* health on a loopback port, metrics off;
* ``TMPDIR`` of its own, whose ``k8s-webhook-server/serving-certs`` (controller-runtime's
  default certificate folder) holds the certificate;
* manifests it needs once ready (Trainer's ``torch-distributed`` ClusterTrainingRuntime).

KServe runs in RawDeployment mode (no Knative Serving or Istio here): its
``inferenceservice-config`` ConfigMap, which it needs to start, is installed from its module
with that mode as default and Ingress creation off.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from deploy.local.build import BuildTarget, Progress, bin_root, ensure_targets
from deploy.local.components import LOOPBACK, free_port

JSONDoc = dict[str, Any]


@dataclass(frozen=True)
class SourcePatch:
    """One change to a file of the module, applied to a copy of its source (`patched_source`):
    ``old`` (which must occur exactly once) becomes ``new``; with ``old`` empty the whole file
    becomes ``new``."""

    path: str
    new: str
    old: str = ""


@dataclass(frozen=True)
class Ports:
    webhook: int
    health: int
    kubeconfig: Path
    cert_dir: Path

    @property
    def health_address(self) -> str:
        return f"{LOOPBACK}:{self.health}"


@dataclass(frozen=True)
class ControllerSpec:
    name: str
    module: str
    version: str
    crds: tuple[str, ...]  # CRD files, or folders of them, inside the module
    main: str = "."  # its main package, relative to the module
    webhooks: str = ""  # the webhook configurations file inside the module
    webhook_patches: tuple[str, ...] = ()  # JSON-patch files (kustomize patches) applied to it
    webhook_resources: tuple[str, ...] = ()  # keep only the webhooks for these resources (all if empty)
    configuration: Callable[[Ports], JSONDoc] | None = None  # its --config file
    flags: Callable[[Ports], list[str]] | None = None  # or its flags
    env: Callable[[Ports], dict[str, str]] = field(default=lambda ports: {})
    patches: tuple[SourcePatch, ...] = ()
    requires: tuple[str, ...] = ()  # controllers it needs started first
    setup: Callable[[Path], list[JSONDoc]] | None = None  # objects it needs before it starts (from its module)
    manifests: tuple[str, ...] = ()  # applied once it is ready
    health_path: str = "/readyz"


def _kubebuilder_configuration(api: str) -> Callable[[Ports], JSONDoc]:
    """The Configuration file JobSet and LWS share (kubebuilder's component config)."""

    def configuration(ports: Ports) -> JSONDoc:
        return {
            "apiVersion": api,
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"port": ports.webhook, "host": LOOPBACK, "certDir": str(ports.cert_dir)},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": ports.health_address},
        }

    return configuration


def _trainer_configuration(ports: Ports) -> JSONDoc:
    return {
        "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "certManagement": {"enable": False},
        "webhook": {"port": ports.webhook, "host": LOOPBACK},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": ports.health_address},
        "clientConnection": {"qps": 100, "burst": 200},
    }


JOBSET = ControllerSpec(
    name="jobset",
    module="sigs.k8s.io/jobset",
    version="v0.10.1",
    crds=("config/components/crd/bases",),
    webhooks="config/components/webhook/manifests.yaml",
    webhook_patches=(
        "config/components/webhook/patches/mutating-patch.yaml",
        "config/components/webhook/patches/validating-patch.yaml",
    ),
    configuration=_kubebuilder_configuration("config.jobset.x-k8s.io/v1alpha1"),
)
LWS = ControllerSpec(
    name="lws",
    module="sigs.k8s.io/lws",
    version="v0.7.0",
    crds=("config/crd/bases",),
    webhooks="config/webhook/manifests.yaml",
    webhook_patches=("config/webhook/mutating-patch.yaml", "config/webhook/validating-patch.yaml"),
    configuration=_kubebuilder_configuration("config.lws.x-k8s.io/v1alpha1"),
    main="./cmd",
)
TRAINER = ControllerSpec(
    name="trainer",
    module="github.com/kubeflow/trainer/v2",
    version="v2.1.0",
    crds=("manifests/base/crds",),
    main="./cmd/trainer-controller-manager",
    webhooks="manifests/base/webhook/manifests.yaml",
    configuration=_trainer_configuration,
    requires=("jobset",),
    manifests=("manifests/base/runtimes/torch_distributed.yaml",),
)
TRAINING_OPERATOR = ControllerSpec(
    name="training-operator",
    module="github.com/kubeflow/training-operator",
    version="v1.8.1",
    # PyTorchJob only: its MPIJob (kubeflow.org/v1) would take the MPI operator's CRD name
    crds=("manifests/base/crds/kubeflow.org_pytorchjobs.yaml",),
    main="./cmd/training-operator.v1",
    webhooks="manifests/base/webhook/manifests.yaml",
    webhook_resources=("pytorchjobs",),
    flags=lambda ports: [
        f"--kubeconfig={ports.kubeconfig}",
        "--enable-scheme=pytorchjob",
        "--metrics-bind-address=0",
        f"--health-probe-bind-address={ports.health_address}",
        f"--webhook-server-port={ports.webhook}",
    ],
    patches=(
        SourcePatch(
            "pkg/cert/cert.go",
            new="""package cert

import ctrl "sigs.k8s.io/controller-runtime"

type Config struct {
	WebhookServiceName string
	WebhookSecretName  string
}

// ManageCerts: Phalanx's local cluster puts a serving certificate for 127.0.0.1 in the webhook
// server's certificate folder, so there is nothing to generate or rotate.
func ManageCerts(_ ctrl.Manager, _ Config, setupFinished chan struct{}) error {
	close(setupFinished)
	return nil
}
""",
        ),
    ),
)
MPI_OPERATOR = ControllerSpec(
    name="mpi-operator",
    module="github.com/kubeflow/mpi-operator",
    version="v0.6.0",
    crds=("manifests/base/kubeflow.org_mpijobs.yaml",),
    main="./cmd/mpi-operator",
    flags=lambda ports: [
        f"--kubeConfig={ports.kubeconfig}",
        "--lock-namespace=kube-system",
        "--kube-api-qps=100",
        "--kube-api-burst=200",
    ],
    env=lambda ports: {"HEALTH_PROBE_BIND_ADDRESS": ports.health_address},
    patches=(
        SourcePatch(
            "cmd/mpi-operator/app/server.go",
            old='fmt.Sprintf(":%d", healthCheckPort)',
            new='os.Getenv("HEALTH_PROBE_BIND_ADDRESS")',
        ),
    ),
    health_path="/healthz",
)
KUBERAY = ControllerSpec(
    name="kuberay",
    module="github.com/ray-project/kuberay/ray-operator",
    version="v1.4.2",
    crds=("config/crd/bases",),
    flags=lambda ports: [
        f"--kubeconfig={ports.kubeconfig}",
        "--enable-leader-election=false",
        "--metrics-addr=0",
        f"--health-probe-bind-address={ports.health_address}",
    ],
)


def _kserve_setup(source: Path) -> list[JSONDoc]:
    """KServe's namespace and its ``inferenceservice-config`` ConfigMap (it exits without one),
    as shipped, but in RawDeployment mode (no Knative, no Istio here: a Deployment per
    component) with no Ingress."""
    (config_map,) = documents(source, ("config/configmap/inferenceservice.yaml",))
    data = config_map["data"]
    data["deploy"] = json.dumps({"defaultDeploymentMode": "RawDeployment"})
    data["ingress"] = json.dumps(json.loads(data["ingress"]) | {"disableIngressCreation": True})
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KSERVE_NAMESPACE}}
    config_map["metadata"]["namespace"] = KSERVE_NAMESPACE
    return [namespace, config_map]


KSERVE_NAMESPACE = "kserve"
KSERVE = ControllerSpec(
    name="kserve",
    module="github.com/kserve/kserve",
    version="v0.15.2",
    crds=("config/crd/full",),
    main="./cmd/manager",
    webhooks="config/webhook/manifests.yaml",
    flags=lambda ports: [
        f"--kubeconfig={ports.kubeconfig}",  # controller-runtime's flag; the state folder in its argv
        "--leader-elect=false",
        "--metrics-addr=0",
        f"--health-probe-addr={ports.health_address}",
        f"--webhook-port={ports.webhook}",
    ],
    env=lambda ports: {"POD_NAMESPACE": KSERVE_NAMESPACE},
    setup=_kserve_setup,
)
CONTROLLERS = {c.name: c for c in (JOBSET, LWS, TRAINER, TRAINING_OPERATOR, MPI_OPERATOR, KUBERAY, KSERVE)}


def with_requirements(names: tuple[str, ...]) -> tuple[str, ...]:
    """``names`` with the controllers they need, each after what it needs; unknown names raise."""
    ordered: list[str] = []

    def visit(name: str) -> None:
        spec = CONTROLLERS.get(name)
        if spec is None:
            raise ValueError(f"unknown controller {name!r}; known: {', '.join(CONTROLLERS)}")
        for needed in spec.requires:
            visit(needed)
        if name not in ordered:
            ordered.append(name)

    for name in names:
        visit(name)
    return tuple(ordered)


def binaries() -> tuple[Path, ...]:
    """Where each controller's binary is (whether built or not)."""
    return tuple(bin_root() / f"{s.name}-{s.version}" / s.name for s in CONTROLLERS.values())


def module_dir(spec: ControllerSpec) -> Path:
    """Download the module at its pinned version (cached) and return its unpacked source."""
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"{spec.module}@{spec.version}"], check=True, capture_output=True, text=True
    ).stdout
    return Path(json.loads(out)["Dir"])


def patched_source(spec: ControllerSpec, source: Path) -> Path:
    """The module's source with the spec's patches applied: a copy beside the binaries (the
    module cache is read-only, and ``go build -overlay`` refuses files in it), named with a
    digest of the patches, so a changed patch is a new folder and a new build stamp."""
    if not spec.patches:
        return source
    digest = hashlib.sha256(repr(spec.patches).encode()).hexdigest()[:16]
    folder = bin_root() / "src" / f"{spec.name}-{spec.version}-{digest}"
    if (folder / ".complete").is_file():
        return folder
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp, copy_function=shutil.copyfile)  # copyfile: writable copies
    for folder_path, _, _ in os.walk(tmp):  # the module cache's folders are read-only, and so their copies
        os.chmod(folder_path, 0o755)
    for patch in spec.patches:
        path = tmp / patch.path
        text = patch.new
        if patch.old:
            original = path.read_text()
            found = original.count(patch.old)
            if found != 1:
                where = f"{spec.name} {spec.version}: {patch.path}"
                raise RuntimeError(f"{where} holds {patch.old!r} {found} times, not once")
            text = original.replace(patch.old, patch.new)
        path.write_text(text)
    (tmp / ".complete").touch()
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def target(spec: ControllerSpec, source: Path) -> BuildTarget:
    built = patched_source(spec, source)
    # -C (first) names the folder, so a patched copy's digest is part of the build's stamp
    build = ("go", "build", "-C", str(built), "-trimpath", "-buildvcs=false", "-ldflags=-s -w")
    return BuildTarget(
        spec.name, spec.version, (spec.name,), (*build, "-o", f"{{out}}/{spec.name}", spec.main), None, ()
    )


def ensure(spec: ControllerSpec, progress: Progress = print) -> tuple[Path, Path]:
    """Build the controller if missing; return (binary, module source)."""
    source = module_dir(spec)
    ensure_targets((target(spec, source),), progress)
    return bin_root() / f"{spec.name}-{spec.version}" / spec.name, source  # as binaries() says


@dataclass(frozen=True)
class Prepared:
    argv: list[str]
    env: dict[str, str]
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


_NOT_OBJECTS = ("Kustomization",)  # a kustomize folder's own file (Trainer's CRD folder has one)


def documents(source: Path, paths: tuple[str, ...]) -> list[JSONDoc]:
    """The objects in ``paths`` (files, or folders of ``*.yaml``) inside the module."""
    docs: list[JSONDoc] = []
    for relative in paths:
        path = source / relative
        files = sorted(path.glob("*.yaml")) if path.is_dir() else [path]
        for file in files:
            docs.extend(
                d for d in yaml.safe_load_all(file.read_text()) if d and d.get("kind") not in (None, *_NOT_OBJECTS)
            )
    return docs


def prepare(
    spec: ControllerSpec,
    binary: Path,
    source: Path,
    *,
    state: Path,
    kubeconfig: Path,
    apply: Callable[[JSONDoc], None],
    environ: Mapping[str, str],
) -> Prepared:
    """Install the CRDs and webhook configurations; return the command line to start it."""
    home = state / spec.name
    tmp = home / "tmp"
    ports = Ports(free_port(), free_port(), kubeconfig, tmp / "k8s-webhook-server" / "serving-certs")
    ca = serving_certificate(ports.cert_dir)
    for doc in documents(source, spec.crds):
        apply(doc)
    for doc in spec.setup(source) if spec.setup else ():
        apply(doc)
    if spec.webhooks:
        for doc in webhook_configurations(spec, source, f"https://{LOOPBACK}:{ports.webhook}", ca):
            apply(doc)
    if spec.configuration is not None:
        (home / "config.yaml").write_text(yaml.safe_dump(spec.configuration(ports)))
        argv = [str(binary), f"--kubeconfig={kubeconfig}", f"--config={home / 'config.yaml'}"]
    else:
        assert spec.flags is not None, spec.name
        argv = [str(binary), *spec.flags(ports)]
    return Prepared(argv, {**environ, "TMPDIR": str(tmp), **spec.env(ports)}, ports.health)


def webhook_configurations(spec: ControllerSpec, source: Path, base_url: str, ca: bytes) -> list[JSONDoc]:
    """The module's webhook configurations with its patches, named after the controller and
    pointed at ``base_url``."""
    docs = documents(source, (spec.webhooks,))
    patches = [yaml.safe_load((source / p).read_text()) for p in spec.webhook_patches]
    bundle = base64.b64encode(ca).decode()
    for doc, patch in zip(docs, [*patches, *([None] * len(docs))], strict=False):
        for op in patch or ():  # whole-webhook replacements (JobSet's and LWS's object selectors)
            if op.get("op") == "replace" and op["path"].startswith("/webhooks/") and op["path"].count("/") == 2:
                doc["webhooks"][int(op["path"].rsplit("/", 1)[1])] = op["value"]
        doc["metadata"] = {"name": f"{spec.name}-{doc['metadata']['name']}"}
        if spec.webhook_resources:
            wanted = set(spec.webhook_resources)
            doc["webhooks"] = [
                h for h in doc["webhooks"] if any(wanted & set(r.get("resources", ())) for r in h.get("rules", ()))
            ]
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": base_url + path, "caBundle": bundle}
    return [d for d in docs if d["webhooks"]]
