"""The image recipe: a base pinned by digest, dependencies from a hash-checked lock that covers
every runtime dependency of pyproject.toml, a command set. (No container engine runs here: the
build itself is not exercised.)"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "deploy" / "kubernetes" / "Dockerfile"
LOCK = ROOT / "deploy" / "kubernetes" / "requirements.lock"


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_the_base_is_pinned_by_digest_and_a_command_is_set() -> None:
    lines = [line for line in DOCKERFILE.read_text().splitlines() if line and not line.startswith("#")]
    bases = [line for line in lines if line.startswith("FROM ")]
    assert bases and all(re.search(r"@sha256:[0-9a-f]{64}\b", b) for b in bases), bases
    assert any(line.startswith("CMD [") for line in lines)
    assert any("--require-hashes" in line and "requirements.lock" in line for line in lines)
    assert any(line.startswith("USER ") and line.split()[1] != "0" for line in lines)


def test_the_lock_pins_every_runtime_dependency_with_hashes() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    text = LOCK.read_text()
    pinned = {m.group(1).lower(): m.group(2) for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+) \\$", text, re.M)}
    for requirement in project["dependencies"]:
        assert _name(requirement) in pinned, f"{requirement} is not in {LOCK.name}: regenerate it"
    blocks = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n\n", 1)[-1])
    assert all("--hash=sha256:" in b for b in blocks if "==" in b)
    assert pinned["ortools"] == "9.15.6755"  # pyproject pins it exactly: the lock must agree
