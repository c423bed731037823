"""Typed outcomes, from the gang state machine and the per-node checks to the wire.

Each filter outcome says what it causes in kube-scheduler, as its framework's status codes do
(Success / Unschedulable / UnschedulableAndUnresolvable / Error). The verbs map an outcome to
one field of the extender reply; nothing downstream parses a message to learn an outcome.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class Fit(enum.Enum):
    """The outcome of a filter call for one pod."""

    #: `NodeNames`: the pod may go to these nodes.
    FITS = "fits"
    #: `NodeNames` untouched: Phalanx has no opinion (the pod asks for nothing it manages).
    PASSTHROUGH = "passthrough"
    #: `FailedNodes`: does not fit now; a cluster change may help, and so may preemption.
    UNSCHEDULABLE = "unschedulable"
    #: `FailedAndUnresolvableNodes`: no eviction can help (waiting for gang quorum or for a
    #: gang definition, an invalid request, a gang that cannot fit even with every
    #: lower-priority pod gone). kube-scheduler skips preemption for these nodes.
    UNRESOLVABLE = "unresolvable"


class GangPhase(enum.Enum):
    """Where a gang is in the plan-reserve-permit cycle (written to its status)."""

    PENDING = "Pending"  # no reservation: waiting for quorum, a definition, or capacity
    PLANNED = "Planned"  # every needed member has a reserved node and devices
    BINDING = "Binding"  # the permit gate opened: members are being bound
    SCHEDULED = "Scheduled"  # every planned member is bound


@dataclass(frozen=True, slots=True)
class Verdict:
    """A filter answer: the passing nodes, and why the others fail, with what that causes."""

    outcome: Fit
    passed: list[str] = field(default_factory=list)
    message: str = ""  # the reason given for every failing node
    failed: dict[str, str] = field(default_factory=dict)  # per-node reasons, when they differ

    @staticmethod
    def fits(nodes: list[str]) -> Verdict:
        return Verdict(Fit.FITS, nodes)

    @staticmethod
    def unschedulable(message: str) -> Verdict:
        return Verdict(Fit.UNSCHEDULABLE, message=message)

    @staticmethod
    def unresolvable(message: str) -> Verdict:
        return Verdict(Fit.UNRESOLVABLE, message=message)


@dataclass(frozen=True, slots=True)
class Then:
    """A verb's reply and work to do once it is sent: the server's connection thread does
    `after` right after writing the reply, before it reads that connection's next request, so
    the work leaves the caller's wait (kube-scheduler's serial cycle) without being put off."""

    reply: Any
    after: Callable[[], None]
