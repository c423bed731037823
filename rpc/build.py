"""Generate the Python code of rpc/*.proto beside them (`python -m rpc.build`).

The output is `rpc/<name>_pb2.py`, `_pb2.pyi` and `_pb2_grpc.py`, imported as
`from rpc import nodeagent_pb2`. It is rebuilt only when a .proto or the generator changed (a
stamp holds their hash), so `make deps` stays instant when nothing did.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
STAMP = HERE / ".generated"


def protos() -> list[Path]:
    return sorted(HERE.glob("*.proto"))


def digest() -> str:
    from grpc_tools import __file__ as tools  # the generator's version is part of the output

    h = hashlib.sha256(Path(tools).parent.name.encode())
    from importlib.metadata import version

    h.update(version("grpcio-tools").encode())
    for p in protos():
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def build(*, force: bool = False) -> bool:
    """Generate when stale; True when it ran."""
    want = digest()
    outputs = [HERE / f"{p.stem}{suffix}" for p in protos() for suffix in ("_pb2.py", "_pb2_grpc.py")]
    if not force and STAMP.exists() and STAMP.read_text() == want and all(o.exists() for o in outputs):
        return False
    from grpc_tools import protoc

    for p in protos():
        args = [
            "protoc",
            f"-I{ROOT}",
            f"--python_out={ROOT}",
            f"--pyi_out={ROOT}",
            f"--grpc_python_out={ROOT}",
            str(p.relative_to(ROOT)),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {p.relative_to(ROOT)}")
    STAMP.write_text(want)
    return True


if __name__ == "__main__":
    ran = build(force="--force" in sys.argv)
    names = ", ".join(p.name for p in protos())
    print(f"rpc: generated the Python code of {names}" if ran else "rpc: generated code up to date")
