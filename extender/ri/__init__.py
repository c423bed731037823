"""Resource Interfaces (RI): how Phalanx understands workload kinds it was not written for.

An RI (NVIDIA Run:ai's format, see /work/shared/seeds/resource-interface.txt) describes a CRD:
its root and child components with their GVKs and owners, where pod specs live in the CR, how
pods map back to components and instances, how the CR's status reads, and how pods form gangs
(`optimizationInstructions.gangScheduling`). Every path is jq, run through libjq.

Pure: no Kubernetes client, no HTTP. The modules, in the order data flows:
`model` (wire models) → `structure` (document → pieces) → `validate` (every violation) →
`interface` (`parse`, `ResourceInterface.evaluate`), which uses `instances` (CR side),
`pods` (pod side, one jq run per pod), `gangs` (sizes) and `status`; `registry` holds the
registered workload types (the `POST /api/v1/workload-types` body) and the shipped defaults.
"""

from extender.ri.budget import REASON_BUDGET
from extender.ri.gangs import RIGang
from extender.ri.instances import ComponentInstance
from extender.ri.interface import Evaluation, ResourceInterface, Unassigned, parse
from extender.ri.model import (
    GVK,
    STATUS_COMPLETED,
    STATUS_FAILED,
    STATUS_INITIALIZING,
    STATUS_PENDING,
    STATUS_RUNNING,
    STATUSES,
    InvalidDefinition,
    Violation,
)
from extender.ri.pods import (
    REASON_AMBIGUOUS_COMPONENT,
    REASON_NO_COMPONENT,
    REASON_NO_GANG_SCHEDULING,
    REASON_NO_NAME,
    REASON_NO_POD_GROUP,
    REASON_NULL_KEY,
    Placement,
)

__all__ = [
    "GVK",
    "REASON_AMBIGUOUS_COMPONENT",
    "REASON_BUDGET",
    "REASON_NO_COMPONENT",
    "REASON_NO_GANG_SCHEDULING",
    "REASON_NO_NAME",
    "REASON_NO_POD_GROUP",
    "REASON_NULL_KEY",
    "STATUSES",
    "STATUS_COMPLETED",
    "STATUS_FAILED",
    "STATUS_INITIALIZING",
    "STATUS_PENDING",
    "STATUS_RUNNING",
    "ComponentInstance",
    "Evaluation",
    "InvalidDefinition",
    "Placement",
    "RIGang",
    "ResourceInterface",
    "Unassigned",
    "Violation",
    "parse",
]
