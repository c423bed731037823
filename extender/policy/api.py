"""`POST /api/v1/policies/effective`: what the policies would make of a submission, without
submitting it.

Request: `{"namespace": "team-a", "queue": "research" (optional: else the namespace's queue),
"workload": {<policy fields>}}` or `{"namespace": ..., "pod": {<a pod or pod template>}}`.
Reply: the policies that apply, the merged defaults and rules with the policy each came from,
the effective value of every field with its source ("submission" or the policy whose default
it is) and the violations, one per broken rule. RBAC: `get` on `phalanx.io/workloadpolicies`
(it reads policies; it changes nothing, so a POST is checked as a read).
"""

from __future__ import annotations

from typing import Any

import orjson

from extender.policy import fields
from extender.policy.evaluate import effective_json
from extender.policy.webhook import Admission
from extender.server import Reply, Route

PATH = "/api/v1/policies/effective"
MAX_BODY = 2**20


class PolicyApi:
    def __init__(self, admission: Admission) -> None:
        self.admission = admission

    def routes(self) -> list[Route]:
        return [
            Route(frozenset({"POST"}), PATH, self._handle, max_body=MAX_BODY, rbac="workloadpolicies", rbac_verb="get")
        ]

    def _handle(self, method: str, path: str, body: bytes) -> Reply:
        status, reply = self.effective(body)
        return Reply.json(status, reply)

    def effective(self, body: bytes) -> tuple[int, Any]:
        try:
            request = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            return 400, {"error": f"body: not JSON: {e}"}
        if not isinstance(request, dict):
            return 400, {"error": "body: expected an object with namespace and workload (or pod)"}
        problems = []
        namespace = request.get("namespace", "")
        if not isinstance(namespace, str) or not namespace:
            problems.append("namespace: required, a string")
        queue = request.get("queue")
        if queue is not None and not isinstance(queue, str):
            problems.append("queue: a string")
        workload, pod = request.get("workload"), request.get("pod")
        if (workload is None) == (pod is None):
            problems.append("workload or pod: give exactly one")
        elif workload is not None and not isinstance(workload, dict):
            problems.append("workload: an object of policy fields")
        elif pod is not None and not isinstance(pod, dict):
            problems.append("pod: a pod or pod template object")
        if problems:
            return 400, {"error": "; ".join(problems)}
        if isinstance(pod, dict):
            workload, _ = fields.read_pod(pod)
        queue = queue or self.admission.queue_of(namespace, {})
        effective, result = self.admission.preview(namespace, queue, workload if isinstance(workload, dict) else {})
        return 200, {
            "namespace": namespace,
            "queue": queue,
            "policies": effective_json(effective),
            "values": result.values,
            "sources": result.sources,
            "violations": [
                {"field": v.field, "rule": v.rule, "message": v.message, "policy": v.policy} for v in result.violations
            ],
        }
