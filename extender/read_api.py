"""The read API: what the extender sees, as JSON (GET /api/v1/gangs, /nodes, /pools, /queues).

Thin handlers over the cache and the gang manager: parse the path, look up, map. Each takes
the rest of the path below its prefix and returns (HTTP status, JSON body).
"""

from __future__ import annotations

from typing import Any

from extender import pools
from extender.cache import Cache
from extender.gangs.manager import GangManager
from extender.queues import QueueBook, view_json
from solver import Node

Reply = tuple[int, Any]


class ReadApi:
    def __init__(self, cache: Cache, gangs: GangManager, queues: QueueBook | None = None) -> None:
        self.cache = cache
        self.gangs = gangs
        self.queues = queues

    def queues_(self, rest: str) -> Reply:
        """GET /api/v1/queues and /api/v1/queues/{name}: each queue's allocation, deserved quota,
        fair share, limit and demand per resource, pending pods and gangs, the oldest wait."""
        views = [view_json(v) for v in self.queues.views()] if self.queues is not None else []
        wanted = rest.strip("/")
        if not wanted:
            return 200, {"queues": views}
        found = [q for q in views if q["name"] == wanted]
        return (200, found[0]) if found else (404, {"error": f"no queue {wanted!r}"})

    def gangs_(self, rest: str) -> Reply:
        """GET /api/v1/gangs and /api/v1/gangs/{namespace}/{name}."""
        gangs = self.gangs.describe()
        parts = [p for p in rest.split("/") if p]
        if not parts:
            return 200, {"gangs": gangs}
        if len(parts) != 2:
            return 404, {"error": "use /api/v1/gangs/{namespace}/{name}"}
        prefix = f"{parts[0]}/{parts[1]}"
        matching = [g for g in gangs if _named(g["key"], prefix)]
        if not matching:
            return 404, {"error": f"no gang {prefix}"}
        return 200, {"gangs": matching}

    def pools(self, rest: str) -> Reply:
        """GET /api/v1/pools and /api/v1/pools/{name}: capacity per GPU pool (TFLOPs physical,
        virtual with oversubscription, allocated and available; VRAM likewise). Nodes in no
        pool are summed under the name "-"."""
        hardware = self.cache.hardware
        members: dict[str, list[Node]] = {p.name: [] for p in hardware.pools}
        members["-"] = []
        for node in self.cache.snapshot().nodes:
            pool = hardware.pool_of(node.name, node.labels)
            members[pool.name if pool is not None else "-"].append(node)
        out = [pools.summary(hardware.by_name.get(name), name, nodes) for name, nodes in members.items()]
        wanted = rest.strip("/")
        if not wanted:
            return 200, {"pools": out}
        found = [p for p in out if p["name"] == wanted]
        return (200, found[0]) if found else (404, {"error": f"no GPU pool {wanted!r}"})

    def nodes(self, rest: str) -> Reply:
        """GET /api/v1/nodes/{name}: the cache's view of one node (what the solver sees)."""
        name = rest.strip("/")
        model = self.cache.node_model(name)
        if model is None:
            return 404, {"error": f"no node {name!r} in the cache"}
        on_node = self.cache.counted(name)
        counted = [{"pod": c.key, "uid": c.uid, "assumed": c.assumed} for c in on_node]
        holders: dict[int, list[dict[str, Any]]] = {}
        for c in on_node:
            for a in c.devices:
                holder = {"pod": c.key or c.uid, "milli": a.milli, "memoryMiB": a.memory_mib, "mig": a.mig_profile}
                holders.setdefault(a.index, []).append(holder)
        free = model.free
        return 200, {
            "name": name,
            "topology": list(model.topology),
            "free": {"cpuMilli": free.cpu_milli, "memoryMiB": free.memory_mib, "pods": free.pods},
            "gpus": [
                {
                    "index": d.index,
                    "model": d.model,
                    "memoryMiB": d.memory_mib,
                    "freeMilli": d.free_milli,
                    "freeMemoryMiB": d.free_memory_mib,
                    "mig": {s.profile: s.free for s in d.mig},
                    "migLayout": [{"profile": s.profile, "start": s.start} for s in d.mig_layout],
                    "tflops": d.tflops / 1000,
                    "freeTFlops": d.free_tflops / 1000,
                    "holders": holders.get(d.index, []),
                }
                for d in model.gpus
            ],
            "pods": counted,
        }


def _named(key: str, prefix: str) -> bool:
    """Whether a gang key ("wl:ns/name/group/replica", "pg:ns/name") belongs to ns/name."""
    body = key.split(":", 1)[-1]
    return body == prefix or body.startswith(prefix + "/")
