"""What a failed Kubernetes API call means to the operator (kube_api.py raises these), and the owner check
that keeps it from replacing or deleting an object it does not own."""
from __future__ import annotations

import json
from typing import Any


class KubeError(Exception):
    """A Kubernetes API call failed; ``status`` is the HTTP status (0 if no response)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class Conflict(KubeError):
    """The object changed since it was read (optimistic concurrency): observe again."""


class NameTaken(KubeError):
    """An object the operator would create or replace is named like one it does not own."""

    def __init__(self, kind: str, namespace: str, name: str, current: dict[str, Any], owner_uid: str):
        super().__init__(409, f"{kind} {namespace}/{name} already exists and belongs to {owners_text(current)}, "
                              f"not to uid {owner_uid}: delete or rename it; the operator never replaces an "
                              "object it does not own")
        self.kind, self.namespace, self.name = kind, namespace, name


def owner_uids(obj: dict[str, Any]) -> set[str]:
    return {o.get("uid") for o in (obj.get("metadata") or {}).get("ownerReferences") or [] if o.get("uid")}


def owners_text(obj: dict[str, Any]) -> str:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return ", ".join(f"{o.get('kind', '?')} {o.get('name', '?')} (uid {o.get('uid')})" for o in refs) or "no owner"


def refuse_unless_ours(kind: str, namespace: str, body: dict[str, Any], current: dict[str, Any]) -> None:
    """Raise NameTaken if ``body`` names an owner and the existing ``current`` has none of its owners.
    A body without owner references has nothing to check against (snapshot dispose Pods): no check."""
    wanted = owner_uids(body)
    if wanted and not wanted & owner_uids(current):
        raise NameTaken(kind, namespace, body["metadata"]["name"], current, sorted(wanted)[0])


def message_of(text: str) -> str:
    try:
        return json.loads(text).get("message") or text
    except (ValueError, AttributeError):
        return text


def error_for(status: int, message: str) -> KubeError:
    return Conflict(status, message) if status == 409 else KubeError(status, message)
