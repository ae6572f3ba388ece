"""``kubectl get NAME -o json`` answered by one HTTP GET instead of a kubectl process.

The tests poll the API server all the time (a stream's status every half second, its Pods, its events).
A kubectl process costs about 90 ms of CPU per call on this machine against about 1.5 ms for the same GET
from Python, and on two cores shared by two test workers, the operator, Spark and Kafka that CPU is taken
from what is being tested. :class:`ApiReads` answers the plain reads (``get RESOURCE [NAME] [-n NS]``) the
way kubectl does: the resource found by its plural, singular, short name or kind through the API server's
discovery (the group's preferred version), a list as kubectl prints it (``kind: List``, every item with its
``apiVersion`` and ``kind``), a missing object as kubectl's ``NotFound`` error. Anything else (selectors,
``-A``, ``resource.version.group`` names, several resources) is not a plain read: ``answer`` returns None
and the caller runs kubectl.
"""
from __future__ import annotations

import json
import threading
from typing import Any

from kubernetes import client, config


class ReadFailed(Exception):
    """The API server refused or failed a read; the message is kubectl's (``Error from server (...)``)."""


class ApiReads:
    def __init__(self, kubeconfig: str):
        self.kubeconfig = kubeconfig
        self._api: client.ApiClient | None = None
        self._resources: dict[str, tuple[str, str, str, bool]] | None = None   # name -> (prefix, plural, kind, ns'd)
        self._lock = threading.Lock()

    # -------------------------------------------------------------- what is a plain read
    @staticmethod
    def plain(args: tuple[str, ...]) -> tuple[str, str | None, str | None] | None:
        """``(resource, name, namespace)`` of ``get RESOURCE [NAME] [-n NS]``, or None for anything else."""
        if not args or args[0] != "get":
            return None
        rest, namespace, words = list(args[1:]), None, []
        while rest:
            word = rest.pop(0)
            if word in ("-n", "--namespace") and rest:
                namespace = rest.pop(0)
            elif word.startswith("--namespace="):
                namespace = word.split("=", 1)[1]
            elif word.startswith("-"):
                return None
            else:
                words.append(word)
        if not 1 <= len(words) <= 2 or any(c in words[0] for c in "./,"):
            return None
        return words[0], (words[1] if len(words) == 2 else None), namespace

    def answer(self, args: tuple[str, ...]) -> dict[str, Any] | None:
        """kubectl's JSON for a plain read; None when ``args`` is not one (or names no resource found)."""
        read = self.plain(args)
        if read is None:
            return None
        resource, name, namespace = read
        found = self._resource(resource)
        if found is None:
            return None
        try:
            return self._read(found, name, namespace)
        except ReadFailed as exc:
            # A version no longer served (a CRD applied again with others) answers NotFound too: discover
            # again, and read again if the resource moved.
            if "(NotFound)" not in str(exc) or (moved := self._resource(resource, fresh=True)) in (None, found):
                raise
            return self._read(moved, name, namespace)

    def _read(self, found: tuple[str, str, str, bool], name: str | None, namespace: str | None) -> dict[str, Any]:
        prefix, plural, kind, namespaced = found
        base = f"{prefix}/namespaces/{namespace or 'default'}/{plural}" if namespaced else f"{prefix}/{plural}"
        if name is not None:
            group = prefix.split("/")[2] if prefix.startswith("/apis/") else ""
            return _shown(self._get(f"{base}/{name}", f'{plural}{"." + group if group else ""} "{name}" not found'))
        listed = self._get(base, "")
        version = listed.get("apiVersion", "v1")
        items = [_shown({"apiVersion": version, "kind": kind, **item}) for item in listed.get("items") or []]
        return {"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}}

    # -------------------------------------------------------------- the API server
    def _client(self) -> client.ApiClient:
        with self._lock:
            if self._api is None:
                self._api = config.new_client_from_config(config_file=self.kubeconfig)
            return self._api

    def _get(self, path: str, not_found: str) -> dict[str, Any]:
        api = self._client()
        try:
            method, url, headers, _, _ = api.param_serialize("GET", path, header_params={"Accept": "application/json"},
                                                             auth_settings=["BearerToken"])
            resp = api.call_api(method, url, headers, _request_timeout=(10, 60))
            data = resp.read()
        except Exception as exc:  # noqa: BLE001 - a connection failure reads as kubectl's would
            raise ReadFailed(f"Unable to connect to the server: {exc}") from None
        if resp.status >= 400:
            reason = {404: "NotFound", 403: "Forbidden", 401: "Unauthorized"}.get(resp.status, str(resp.status))
            detail = not_found if resp.status == 404 and not_found else _message(data) or resp.reason
            raise ReadFailed(f"Error from server ({reason}): {detail}")
        return json.loads(data)

    def _resource(self, word: str, fresh: bool = False) -> tuple[str, str, str, bool] | None:
        word = word.lower()
        with self._lock:
            known = self._resources
        if known is None or fresh or word not in known:   # a resource not seen yet (a CRD applied since)
            known = self._discover()
            with self._lock:
                self._resources = known
        return known.get(word)

    def _discover(self) -> dict[str, tuple[str, str, str, bool]]:
        found: dict[str, tuple[str, str, str, bool]] = {}
        lists = [("/api/v1", self._get("/api/v1", ""))]
        for group in self._get("/apis", "").get("groups") or []:
            preferred = (group.get("preferredVersion") or {}).get("groupVersion")
            if preferred:
                lists.append((f"/apis/{preferred}", self._get(f"/apis/{preferred}", "")))
        for prefix, listed in reversed(lists):   # the core group, then the earliest group, wins a name
            for r in listed.get("resources") or []:
                if "/" in r["name"]:
                    continue                                     # a subresource
                entry = (prefix, r["name"], r["kind"], bool(r.get("namespaced")))
                for alias in (r["name"], r.get("singularName") or "", r["kind"].lower(), *(r.get("shortNames") or [])):
                    if alias:
                        found[alias.lower()] = entry
        return found


def _shown(obj: dict[str, Any]) -> dict[str, Any]:
    """As kubectl prints it: without ``metadata.managedFields`` (``--show-managed-fields=false``)."""
    (obj.get("metadata") or {}).pop("managedFields", None)
    return obj


def _message(body: Any) -> str:
    try:
        return json.loads(body).get("message", "")
    except (TypeError, ValueError):
        return ""
