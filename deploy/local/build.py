"""Build (once) and locate the control-plane binaries.

Binaries live in ``<cache>/bin/<component>-<version>/``. A ``.stamp`` file beside them holds a
hash of what produced them (wrapper sources, linker flags, Go version), so a second run finds
them and starts in seconds, while a changed wrapper or toolchain triggers a rebuild. Builds run
niced, one at a time, under a file lock so concurrent ``up`` calls never build twice; each
writes into a temporary folder that is renamed into place only when complete.

``helm`` (for the chart tests) is built the same way but on demand (:func:`ensure_helm`), never
by ``up``: a cluster does not wait for it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from deploy.local.paths import GO_SOURCES, bin_root
from deploy.local.versions import ETCD_VERSION, HELM_VERSION, KUBERNETES_VERSION, KWOK_VERSION

Progress = Callable[[str], None]
_TICK_SECONDS = 30.0
_STAMP = ".stamp"


@dataclass(frozen=True)
class Binaries:
    """Absolute paths of the control-plane executables."""

    etcd: Path
    kube_apiserver: Path
    kube_scheduler: Path
    kwok: Path
    kube_controller_manager: Path


@dataclass(frozen=True)
class BuildTarget:
    """One cached build: which binaries it yields and the go command that makes them."""

    component: str
    version: str
    binaries: tuple[str, ...]
    command: tuple[str, ...]
    workdir: Path | None
    inputs: tuple[Path, ...]

    @property
    def out_dir(self) -> Path:
        return bin_root() / f"{self.component}-{self.version}"


def _kube_ldflags(version: str) -> str:
    # Without these the binaries report v0.0.0-master; feature gates use the compiled-in
    # DefaultKubeBinaryVersion either way, so this is for /version and logs.
    minor = version.split(".")[1]
    values = {"gitVersion": version, "gitMajor": "1", "gitMinor": minor, "gitTreeState": "clean"}
    pkgs = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
    return " ".join(["-s", "-w"] + [f"-X {p}.{k}={v}" for p in pkgs for k, v in values.items()])


def _helm_ldflags(version: str, go_mod: str) -> str:
    # As helm's Makefile: its version, and the Kubernetes version that `helm template` and
    # `helm lint` assume (.Capabilities.KubeVersion, deprecation checks) from its client-go
    # (v0.37.0 -> 1.37); without these helm reports v3.22 and assumes Kubernetes 1.20.
    pinned = re.search(r"^\s*helm\.sh/helm/v3 (v\S+)", go_mod, re.MULTILINE)
    if pinned is None or pinned.group(1) != version:
        found = pinned.group(1) if pinned else "nothing"
        raise RuntimeError(f"deploy/local/go/helm/go.mod pins helm {found}, versions.py {version}")
    client_go = re.search(r"^\s*k8s\.io/client-go v0\.(\d+)\.", go_mod, re.MULTILINE)
    if client_go is None:
        raise RuntimeError("deploy/local/go/helm/go.mod does not require k8s.io/client-go")
    minor = client_go.group(1)
    flags = ["-s", "-w", f"-X helm.sh/helm/v3/internal/version.version={version}"]
    flags += ["-X helm.sh/helm/v3/internal/version.gitTreeState=clean"]
    for pkg in ("helm.sh/helm/v3/pkg/lint/rules", "helm.sh/helm/v3/pkg/chartutil"):
        flags += [f"-X {pkg}.k8sVersionMajor=1", f"-X {pkg}.k8sVersionMinor={minor}"]
    return " ".join(flags)


def _module_inputs(module_dir: Path) -> tuple[Path, ...]:
    files = [module_dir / "go.mod", module_dir / "go.sum", *module_dir.rglob("*.go")]
    return tuple(sorted(files))


def targets() -> tuple[BuildTarget, ...]:
    """Return the build targets in build order (smallest first, so failures show early)."""
    kube_dir, etcd_dir = GO_SOURCES / "kube", GO_SOURCES / "etcd"
    build = ("go", "build", "-trimpath", "-buildvcs=false")
    return (
        BuildTarget(
            "etcd",
            ETCD_VERSION,
            ("etcd",),
            (*build, "-ldflags=-s -w", "-o", "{out}/etcd", "."),
            etcd_dir,
            _module_inputs(etcd_dir),
        ),
        BuildTarget(
            "kwok",
            KWOK_VERSION,
            ("kwok",),
            (
                "go",
                "install",
                "-trimpath",
                "-ldflags=-s -w",
                f"sigs.k8s.io/kwok/cmd/kwok@{KWOK_VERSION}",
            ),
            None,
            (),
        ),
        BuildTarget(
            "kubernetes",
            KUBERNETES_VERSION,
            ("kube-apiserver", "kube-scheduler", "kube-controller-manager"),
            (
                *build,
                f"-ldflags={_kube_ldflags(KUBERNETES_VERSION)}",
                "-o",
                "{out}/",
                "./cmd/kube-apiserver",
                "./cmd/kube-scheduler",
                "./cmd/kube-controller-manager",
            ),
            kube_dir,
            _module_inputs(kube_dir),
        ),
    )


def helm_target() -> BuildTarget:
    """Return the build of the helm CLI: ``cmd/helm`` of the module deploy/local/go/helm pins."""
    helm_dir = GO_SOURCES / "helm"
    ldflags = _helm_ldflags(HELM_VERSION, (helm_dir / "go.mod").read_text())
    return BuildTarget(
        "helm",
        HELM_VERSION,
        ("helm",),
        (
            "go",
            "build",
            "-trimpath",
            "-buildvcs=false",
            f"-ldflags={ldflags}",
            "-o",
            "{out}/helm",
            "helm.sh/helm/v3/cmd/helm",
        ),
        helm_dir,
        _module_inputs(helm_dir),
    )


def _go_version() -> str:
    return subprocess.run(["go", "env", "GOVERSION"], check=True, capture_output=True, text=True).stdout.strip()


def _stamp(target: BuildTarget, go_version: str) -> str:
    digest = hashlib.sha256()
    for part in (go_version, *target.command):
        digest.update(part.encode() + b"\0")
    for path in target.inputs:
        digest.update(path.relative_to(GO_SOURCES).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _is_current(target: BuildTarget, stamp: str) -> bool:
    stamp_file = target.out_dir / _STAMP
    present = all((target.out_dir / name).is_file() for name in target.binaries)
    return present and stamp_file.is_file() and stamp_file.read_text().strip() == stamp


@contextmanager
def _build_lock() -> Iterator[None]:
    bin_root().mkdir(parents=True, exist_ok=True)
    with open(bin_root() / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run_go(
    command: Sequence[str],
    *,
    cwd: Path | None,
    env: dict[str, str],
    log_path: Path,
    label: str,
    progress: Progress,
) -> None:
    started = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(  # niced: the machine is shared with benchmarks
            command,
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: os.nice(10),
        )
        while True:
            try:
                proc.wait(timeout=_TICK_SECONDS)
                break
            except subprocess.TimeoutExpired:
                progress(f"  ... still building {label} ({time.monotonic() - started:.0f} s)")
    if proc.returncode != 0:
        tail = log_path.read_text()[-4000:]
        raise RuntimeError(f"building {label} failed (log: {log_path}):\n{tail}")
    progress(f"built {label} in {time.monotonic() - started:.0f} s")


def _build(target: BuildTarget, stamp: str, progress: Progress) -> None:
    label = f"{', '.join(target.binaries)} {target.version}"
    why = "sources changed" if target.out_dir.exists() else "first time"
    progress(f"building {label} ({why}, several minutes)...")
    tmp = target.out_dir.with_name(target.out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    env = dict(os.environ, GOBIN=str(tmp))
    command = [part.replace("{out}", str(tmp)) for part in target.command]
    log_path = bin_root() / f"build-{target.component}-{target.version}.log"
    _run_go(command, cwd=target.workdir, env=env, log_path=log_path, label=label, progress=progress)
    (tmp / _STAMP).write_text(stamp + "\n")
    shutil.rmtree(target.out_dir, ignore_errors=True)
    tmp.rename(target.out_dir)


def _ensure(build_targets: Sequence[BuildTarget], progress: Progress) -> None:
    go_version = _go_version()
    with _build_lock():
        for target in build_targets:
            stamp = _stamp(target, go_version)
            if not _is_current(target, stamp):
                _build(target, stamp, progress)


def ensure_binaries(progress: Progress = print) -> Binaries:
    """Build whatever is missing or stale and return the binary paths.

    Fast when everything is cached: it hashes a few small files and checks a few paths.
    """
    _ensure(targets(), progress)
    return locate_binaries()


def ensure_targets(build_targets: Sequence[BuildTarget], progress: Progress = print) -> None:
    """Build whichever of ``build_targets`` is missing or stale (under the build lock)."""
    _ensure(build_targets, progress)


def ensure_helm(progress: Progress = print) -> Path:
    """Build the helm CLI if it is missing or stale (about 1.5 min cold on 2 cores); return its path."""
    _ensure((helm_target(),), progress)
    return locate_helm()


def locate_helm() -> Path:
    """Return where the helm binary of the pinned version is (whether built or not)."""
    return bin_root() / f"helm-{HELM_VERSION}" / "helm"


def locate_binaries() -> Binaries:
    """Return where the binaries of the pinned versions are (whether built or not)."""
    kube = bin_root() / f"kubernetes-{KUBERNETES_VERSION}"
    return Binaries(
        etcd=bin_root() / f"etcd-{ETCD_VERSION}" / "etcd",
        kube_apiserver=kube / "kube-apiserver",
        kube_scheduler=kube / "kube-scheduler",
        kwok=bin_root() / f"kwok-{KWOK_VERSION}" / "kwok",
        kube_controller_manager=kube / "kube-controller-manager",
    )
