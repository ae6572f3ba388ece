"""When a Pod the operator makes does not start: the one rule for every such Pod, a stream's (driver, probe,
pre-flight, drain) and a snapshot's (take, inspect, dispose).

*Blocked*: a Pending Pod whose container waits for something that will not come by itself (an image that
cannot be pulled, a missing Secret or ConfigMap) or that no node fits (PodScheduled False, e.g. a claim that
does not exist) says why as soon as the kubelet or scheduler does: ``Ready=False`` with a ``...StartBlocked``
reason, the cause in the message, one Warning per distinct cause. Still not running
``job.driver.startTimeoutSeconds`` of its stream after its creation, it *failed to start*: whoever made it
counts that as a failed attempt (a driver's restart strategy, a snapshot's retries).

*Refused*: a create the API server refuses for good (403 Pod Security, quota or RBAC; 422 invalid; a name
held by an object the resource does not own) is written to status (``Ready=False``, reason ``Refused``, the
server's message) with one Warning per distinct refusal, and tried again every REFUSED_RETRY_SECONDS: a
namespace's policy or quota can change, a tight loop of refused creates helps nobody.

Pure: no I/O; the planners and reconcilers apply it to their own status.
"""
from __future__ import annotations

from datetime import datetime

from eos_job.spec import DriverSpec

from .actions import ApplyConfigMap, ApplyService, CreatePod, Step
from .conditions import READY, get_condition
from .kube_errors import KubeError, NameTaken
from .observed import PodView
from .timeutil import parse, seconds_between

REFUSED_REASON = "Refused"   # Ready=False: the API server refused a Pod or object (message: what and why)
REFUSED_RETRY_SECONDS = 30.0
REFUSED_FIX = "fix the namespace's policy or quota, the stream's podTemplate, or the object in the way"
DEFAULT_START_TIMEOUT = DriverSpec.model_fields["start_timeout_seconds"].default


def past_start_deadline(pod: PodView, timeout: int, now: datetime) -> str | None:
    """A Pod still not running ``timeout`` seconds after its creation: why, as a failure text; None while it
    may still start (or when it runs or ran)."""
    created = parse(pod.created_at)
    if pod.phase not in ("Pending", "Unknown") or created is None or seconds_between(created, now) < timeout:
        return None
    return (f"Pod {pod.name} did not start within {timeout}s (job.driver.startTimeoutSeconds): "
            f"{pod.blocked or 'still Pending'}")


def report_blocked(step: Step, conditions: list, reason: str, what: str, pod: PodView, timeout: int) -> str:
    """The Ready message for a blocked Pod (``pod.blocked`` is set); a Warning ``reason`` when this cause is
    not what the Ready condition already says (one event per distinct cause)."""
    message = f"{what} Pod {pod.name} cannot start: {(pod.blocked or '').rstrip('.')}"
    ready = get_condition(conditions, READY)
    if ready is None or ready.reason != reason or ready.message != message:
        step.event("Warning", reason, f"{message}; it fails after {timeout}s (job.driver.startTimeoutSeconds) "
                                      "unless that is fixed")
    return message


def refused_object(action: object, exc: KubeError) -> str | None:
    """What a create or apply was refused for good ("Pod <name>"), or None for errors a retry may fix."""
    if not (exc.status in (403, 422) or isinstance(exc, NameTaken)):
        return None
    if isinstance(action, (CreatePod, ApplyConfigMap, ApplyService)):
        return f"{action.body.get('kind', 'object')} {action.body['metadata']['name']}"
    return None


def refusal_text(what: str, error: str, fix: str = REFUSED_FIX) -> str:
    return f"{what} was refused: {error}; {fix} (retrying every {REFUSED_RETRY_SECONDS:.0f}s)"
