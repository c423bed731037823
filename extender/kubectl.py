"""`kubectl phalanx`: why a pod or gang waits, gangs and pools at a glance, who holds which GPU.

    kubectl phalanx explain pod|workload|gang NAME [-n NAMESPACE]
    kubectl phalanx status
    kubectl phalanx queues
    kubectl phalanx top gpus
    (-o json on any of them)

It reads the extender's REST API (`GET /api/v1/gangs`, `/pools`, `/queues`, `/nodes/{name}`) with the
caller's own kubeconfig token, so the extender asks the API server whether RBAC lets the caller
read it (the shipped ClusterRole `phalanx-viewer`), and reads pods and nodes from the API server
with the same credentials. The extender listens on its pod's loopback:
`kubectl -n phalanx-system port-forward deploy/phalanx-scheduler 8888` makes the default
`--extender http://127.0.0.1:8888` reach it (`PHALANX_EXTENDER` or `--extender` name another).
Installed by `make deps` as `kubectl-phalanx` in the venv's bin (kubectl finds plugins on PATH).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any, TextIO
from urllib.parse import quote

from extender.gangs.requests import WAITING_QUORUM
from extender.kube import RestKube

DEFAULT_EXTENDER = "http://127.0.0.1:8888"
PERCENTS = ("allocatedVRAMPercent", "allocatedTFlopsPercent")


class CliError(Exception):
    """A failure the user can act on: printed as one line, exit status 1."""


class Client:
    def __init__(self, kube: RestKube, extender: str) -> None:
        self.kube = kube
        self.extender = extender.rstrip("/")

    def phalanx(self, path: str) -> Any:
        """GET the extender's REST API with the caller's token."""
        headers = {k: v for k, v in self.kube.headers.items() if k == "Authorization"}
        request = urllib.request.Request(self.extender + path, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            with e:
                body = e.read()
            try:
                message = json.loads(body).get("Error") or json.loads(body).get("error") or ""
            except ValueError:
                message = body[:200].decode(errors="replace")
            raise CliError(f"the extender answered {e.code} for {path}: {message}") from None
        except OSError as e:
            raise CliError(
                f"cannot reach the extender at {self.extender} ({e}); run "
                "`kubectl -n phalanx-system port-forward deploy/phalanx-scheduler 8888` or pass --extender"
            ) from None

    def kubernetes(self, path: str) -> Any:
        r = self.kube.request("GET", path)
        if r.status == 404:
            return None
        if r.status >= 300:
            message = r.body.get("message", "") if isinstance(r.body, dict) else ""
            raise CliError(f"the API server answered {r.status} for {path}: {message}")
        return r.body


# ---------------------------------------------------------------- explain


def explain(client: Client, kind: str, name: str, namespace: str) -> dict[str, Any]:
    """Why `kind` `name` waits (or where it runs), as a dict the table printer and -o json share."""
    gangs = client.phalanx("/api/v1/gangs")["gangs"]
    if kind == "gang":
        found = [g for g in gangs if g["key"] == name]
        if not found:
            raise CliError(f"no gang {name!r} (kubectl phalanx status lists them)")
        return _gang(found[0])
    if kind == "workload":
        path = f"/api/v1/gangs/{quote(namespace)}/{quote(name)}"
        return _gang(client.phalanx(path)["gangs"][0])
    pod = client.kubernetes(f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}")
    if pod is None:
        raise CliError(f"no pod {namespace}/{name}")
    key = f"{namespace}/{name}"
    gang = next((g for g in gangs if key in g.get("pods", ())), None)
    if gang is not None:
        return {"pod": key, "node": pod["spec"].get("nodeName") or None, **_gang(gang)}
    node = pod["spec"].get("nodeName")
    if node:
        return {"pod": key, "node": node, "why": f"bound to {node}", "change": ""}
    conditions: list[dict[str, Any]] = pod.get("status", {}).get("conditions", [])
    condition = next((c for c in conditions if c["type"] == "PodScheduled"), {})
    why = condition.get("message") or "not tried by the scheduler yet"
    return {"pod": key, "node": None, "why": why, "change": _change(why)}


def _gang(g: dict[str, Any]) -> dict[str, Any]:
    reason = g.get("pendingReason") or ""
    scheduled = g["phase"] == "Scheduled"
    if scheduled:
        why = f"all {g['bound']} members bound"
    elif g.get("plan"):
        why = f"planned: {len(g['plan'])} members reserved, waiting for the rest to reach bind"
    else:
        why = reason or "no member has reached the scheduler yet"
    return {
        "gang": g["key"],
        "source": g.get("source", ""),
        "members": g["members"],
        "minCount": g.get("minCount"),
        "bound": g["bound"],
        "phase": g["phase"],
        "why": why,
        "change": "" if scheduled or g.get("plan") else _change(reason, g),
        "plan": g.get("plan") or {},
        "nodes": g.get("nodes") or {},
        "solveMs": g.get("solveMs"),
    }


_QUORUM = re.compile(re.escape(WAITING_QUORUM) + r"(?: of sub-group (\S+))? (\d+)/(\d+)")
_LIMIT = re.compile(r"queue (\S+): (\S+) limit \S+, in use")
_FAIR = re.compile(r"queue (\S+): \S+ fair share .* while queue (\S+) waits")


def _change(reason: str, gang: dict[str, Any] | None = None) -> str:
    """What would let it be placed, read from the binding constraint the solver named."""
    if m := _QUORUM.search(reason):
        group, have, need = m.group(1), int(m.group(2)), int(m.group(3))
        where = f" of sub-group {group}" if group else ""
        return f"{need - have} more member(s){where} must exist (or lower minCount to {have})"
    if "within one" in reason:
        level = reason.split("within one", 1)[1].split()[0].rstrip(";,")
        return (
            f"free capacity inside one {level} (other pods leave or nodes join), "
            f"or relax the gang's required topology above {level}, or make it smaller"
        )
    if "only " in reason and " members fit" in reason:
        return "free capacity (other pods leave or nodes join), or lower minCount"
    if m := _LIMIT.search(reason):
        return f"raise queue {m.group(1)}'s {m.group(2)} limit, or wait for its running work to finish"
    if m := _FAIR.search(reason):
        return (
            f"wait: queue {m.group(2)} is below its fair share; or give queue {m.group(1)} "
            "more weight or a deserved quota"
        )
    if "fits on none" in reason:
        return "check the group's node selector, tolerations and requests against the nodes"
    if "higher-priority or earlier gangs" in reason:
        return "wait for gangs ahead of it, or raise its priority"
    if "minCount" in reason or "invalid" in reason.lower():
        return "fix the gang's definition"
    return ""


# ---------------------------------------------------------------- status, top


def status(client: Client) -> dict[str, Any]:
    gangs = client.phalanx("/api/v1/gangs")["gangs"]
    pools = client.phalanx("/api/v1/pools")["pools"]
    return {"gangs": gangs, "pools": pools}


def queues(client: Client) -> dict[str, Any]:
    return {"queues": client.phalanx("/api/v1/queues")["queues"]}


def top_gpus(client: Client) -> dict[str, Any]:
    nodes = client.kubernetes("/api/v1/nodes") or {"items": []}
    rows = []
    for n in nodes["items"]:
        name = n["metadata"]["name"]
        try:
            view = client.phalanx(f"/api/v1/nodes/{quote(name)}")
        except CliError as e:
            if " 404 " in str(e):
                continue  # a node Phalanx skips (invalid) or has not seen yet
            raise
        for d in view["gpus"]:
            used_memory = d["memoryMiB"] - d["freeMemoryMiB"]
            rows.append(
                {
                    "node": name,
                    "gpu": d["index"],
                    "model": d["model"],
                    "share": round((1000 - d["freeMilli"]) / 1000, 3),
                    "memoryMiB": used_memory,
                    "memoryTotalMiB": d["memoryMiB"],
                    "mig": [s["profile"] for s in d["migLayout"]],
                    "holders": d["holders"],
                }
            )
    return {"gpus": rows}


# ---------------------------------------------------------------- output


def _table(out: TextIO, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str(c) for c in header], *[[("-" if c in (None, "") else str(c)) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for r in cells:
        out.write("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n")


def render(command: str, result: dict[str, Any], out: TextIO) -> None:
    if command == "explain":
        subject = f"pod {result['pod']}" if "pod" in result else f"gang {result['gang']}"
        if "gang" in result and "pod" in result:
            subject += f" (gang {result['gang']})"
        out.write(f"{subject}: {result['why']}\n")
        if "gang" in result:
            minimum = f", min {result['minCount']}" if result.get("minCount") else ""
            solve = f", last solve {result['solveMs']} ms" if result.get("solveMs") else ""
            out.write(f"  members: {result['members']}{minimum}, bound {result['bound']}, {result['phase']}{solve}\n")
            for member, node in sorted((result.get("plan") or {}).items()):
                out.write(f"  planned: {member} -> {node}\n")
        if result.get("change"):
            out.write(f"  to place it: {result['change']}\n")
    elif command == "status":
        gangs = result["gangs"]
        _table(
            out,
            ["GANG", "PHASE", "MEMBERS", "MIN", "BOUND", "REASON"],
            [[g["key"], g["phase"], g["members"], g["minCount"], g["bound"], g["pendingReason"]] for g in gangs],
        )
        out.write("\n")
        _table(
            out,
            ["POOL", "NODES", "GPUS", "VRAM USED", "TFLOPS USED"],
            [
                [
                    p["name"],
                    p["totalNodes"],
                    p["totalGPUs"],
                    f"{p['allocatedVRAMPercent']}%",
                    f"{p['allocatedTFlopsPercent']}%",
                ]
                for p in result["pools"]
            ],
        )
    elif command == "queues":
        _table(
            out,
            ["QUEUE", "PARENT", "WEIGHT", "GPU USED", "DESERVED", "FAIR", "LIMIT", "PENDING PODS", "GANGS", "OLDEST"],
            [
                [
                    q["name"],
                    q["parent"],
                    q["weight"],
                    *(q["summary"]["gpu"][k] for k in ("allocated", "deserved", "fairShare", "limit")),
                    q["pendingPods"],
                    q["pendingGangs"],
                    q["oldestWait"],
                ]
                for q in result["queues"]
            ],
        )
        for q in result["queues"]:
            for problem in q.get("problems") or []:
                out.write(f"warning: {problem}\n")
    else:
        _table(
            out,
            ["NODE", "GPU", "MODEL", "SHARE", "MEMORY", "MIG", "HOLDERS"],
            [
                [
                    r["node"],
                    r["gpu"],
                    r["model"],
                    r["share"],
                    f"{r['memoryMiB']}/{r['memoryTotalMiB']} MiB",
                    ",".join(r["mig"]),
                    ",".join(h["pod"] for h in r["holders"]),
                ]
                for r in result["gpus"]
            ],
        )


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout) -> int:
    ap = argparse.ArgumentParser(prog="kubectl phalanx", description=__doc__.split("\n\n")[0])
    ap.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="kubeconfig (default: $KUBECONFIG)")
    ap.add_argument("--extender", default=os.environ.get("PHALANX_EXTENDER", DEFAULT_EXTENDER))
    ap.add_argument("-n", "--namespace", default="default")
    ap.add_argument("-o", "--output", choices=("table", "json"), default="table")
    sub = ap.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("explain", help="why a pod, Workload or gang waits, and what would let it be placed")
    ex.add_argument("kind", choices=("pod", "workload", "gang"))
    ex.add_argument("name")
    sub.add_parser("status", help="gangs and GPU pools")
    sub.add_parser("queues", help="queues: GPUs used, deserved, fair share and limit; what waits")
    top = sub.add_parser("top", help="who holds which GPU: share, memory, MIG slices per device")
    top.add_argument("what", choices=("gpus",))
    args = ap.parse_args(argv)
    try:
        kubeconfig = args.kubeconfig.split(os.pathsep)[0] if args.kubeconfig else os.path.expanduser("~/.kube/config")
        client = Client(RestKube.from_kubeconfig(kubeconfig), args.extender)
        if args.command == "explain":
            result = explain(client, args.kind, args.name, args.namespace)
        elif args.command == "status":
            result = status(client)
        elif args.command == "queues":
            result = queues(client)
        else:
            result = top_gpus(client)
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.output == "json":
        out.write(json.dumps(result, indent=2, sort_keys=True) + "\n")
    else:
        render(args.command, result, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
