"""The real Kubernetes API: plain JSON (camelCase dicts, as the API returns them) through the
``kubernetes`` client's transport, called in threads of its own so the kopf event loop never blocks.
It implements adapters.Kube; tests use the in-memory fake in tests/operator/fakes.py instead.
"""
from __future__ import annotations

import asyncio
import functools
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any, Iterator, Protocol
from urllib.parse import quote as _url_quote

from eos_job.spec import API_GROUP, API_VERSION, KIND, PLURAL
from eos_job.snapshot_resource import SNAPSHOT_PLURAL

from .events import EventCache
from .children import LABEL_STREAM, selector_string, stream_selector
from .kube_errors import (Conflict, KubeError, NameTaken, error_for, message_of, owner_uids,  # noqa: F401
                          owners_text, refuse_unless_ours)
from .op_metrics import OperatorMetrics

log = logging.getLogger(__name__)
FIELD_MANAGER = "eos-operator"


def quote(segment: str) -> str:
    """One segment of an API path (a namespace, a name), '/' escaped too: a name such as
    ``../../<namespace>/exactlyoncesnapshots/<name>`` stays one segment of the caller's namespace, never a
    path into another (the CRD refuses such a spec.restoreFrom; this is the second line). No object is named
    '.' or '..', which a server would resolve as a path step: refused."""
    if segment in (".", ".."):
        raise ValueError(f"{segment!r} is not an object name")
    return _url_quote(segment, safe="")


class ObjectRef(Protocol):
    """What an event is about: a StreamRef (kind ExactlyOnceStream) or anything with name, namespace, uid and
    optionally ``kind`` (e.g. snapshots.SnapshotRef)."""
    name: str
    namespace: str
    uid: str


class KubernetesApi:
    """The real cluster, through the kubernetes client's transport (sync, in threads of its own).

    API calls get their own thread pool: in the default one (6 threads on 2 cores) a few slow Kafka
    reads or resolutions, which cannot be cancelled, would hold every thread and stall every
    reconcile's API calls behind them.
    """

    CONNECT_TIMEOUT_S, READ_TIMEOUT_S = 5.0, 30.0
    # Where the resources are served: the storage version. A test may subclass with a scratch group of its own
    # (tests/stack/test_apiversions.py) so that nothing else on a shared API server sees its CRDs.
    GROUP_VERSION, PLURAL, SNAPSHOT_PLURAL = f"{API_GROUP}/{API_VERSION}", PLURAL, SNAPSHOT_PLURAL

    def __init__(self, api_client: Any, threads: int = 16, metrics: OperatorMetrics | None = None):
        self.api = api_client
        self.metrics = metrics   # counts failed calls (None: not counted)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kube-api")
        self.events = EventCache()   # aggregation of repeated events (events.py)

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None = None, context: str | None = None, *,
                        metrics: OperatorMetrics | None = None, **kwargs: Any) -> "KubernetesApi":
        from kubernetes import client, config

        try:
            config.load_incluster_config()
            configuration = client.Configuration.get_default_copy()
        except config.ConfigException:
            configuration = client.Configuration()
            config.load_kube_config(config_file=kubeconfig, context=context,
                                    client_configuration=configuration)
        # Room for every API thread plus the informers' long-lived watches, so no connection is discarded.
        configuration.connection_pool_maxsize = 32
        return cls(client.ApiClient(configuration), metrics=metrics, **kwargs)

    # -- transport ------------------------------------------------------------
    def _call(self, method: str, path: str, body: Any, query: dict[str, str] | None, content_type: str,
              read_timeout: float) -> Any:
        from kubernetes.client.exceptions import ApiException

        if self.metrics is not None:
            self.metrics.kube_request(*verb_and_resource(method, path, query))
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        method_, url, headers, body_, post = self.api.param_serialize(
            method=method, resource_path=path, query_params=list((query or {}).items()),
            header_params=headers, body=body, auth_settings=["BearerToken"])
        try:
            return self.api.call_api(method_, url, header_params=headers, body=body_, post_params=post,
                                     _request_timeout=(self.CONNECT_TIMEOUT_S, read_timeout))
        except ApiException as exc:  # transport-level failure with a status
            self._failed(method, path, exc.status or 0)
            raise error_for(exc.status or 0, exc.body or str(exc)) from exc
        except Exception:  # no answer at all: refused, reset, timed out
            self._failed(method, path, 0)
            raise

    def watch_sync(self, path: str, query: dict[str, str], read_timeout: float) -> Iterator[dict[str, Any]]:
        """Start one watch request (``query`` has watch=true); raises at once if the server refuses it, else
        returns its events as they come (iterating blocks the thread)."""
        from kubernetes.watch.watch import iter_resp_lines

        resp = self._call("GET", path, None, query, "application/json", read_timeout)
        raw = getattr(resp, "response", resp)
        if resp.status >= 400:
            data = resp.read()
            self._failed("GET", path, resp.status)
            raise error_for(resp.status, message_of(data.decode("utf-8") if data else ""))

        def events() -> Iterator[dict[str, Any]]:
            try:
                for line in iter_resp_lines(raw):
                    if line.strip():
                        yield json.loads(line)
            finally:
                release = getattr(raw, "release_conn", None)
                if release is not None:
                    release()
        return events()

    def request_sync(self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None,
                     content_type: str = "application/json") -> dict[str, Any] | None:
        """One request, in the calling thread (an informer's own; the adapters use ``_request``)."""
        resp = self._call(method, path, body, query, content_type, self.READ_TIMEOUT_S)
        try:
            resp.read()
        except Exception:  # no answer at all: reset while reading
            self._failed(method, path, 0)
            raise
        status = resp.status
        text = resp.data.decode("utf-8") if resp.data else ""
        if status >= 400:
            self._failed(method, path, status)
            raise error_for(status, message_of(text))
        return json.loads(text) if text else None

    def _failed(self, method: str, path: str, status: int) -> None:
        if self.metrics is not None:
            self.metrics.kube_api_error(*verb_and_resource(method, path), status)

    async def _request(self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None,
                       content_type: str = "application/json") -> dict[str, Any] | None:
        call = functools.partial(self.request_sync, method, path, body, query, content_type)
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    # -- the stream -----------------------------------------------------------
    def _stream_path(self, namespace: str, name: str) -> str:
        return f"/apis/{self.GROUP_VERSION}/namespaces/{quote(namespace)}/{self.PLURAL}/{quote(name)}"

    async def list_streams(self, namespace: str) -> list[dict[str, Any]]:
        path = f"/apis/{self.GROUP_VERSION}/namespaces/{quote(namespace)}/{self.PLURAL}"
        return list((await self._request("GET", path) or {}).get("items") or [])

    async def _get(self, path: str) -> dict[str, Any] | None:
        """The object at ``path``, None if there is none (404)."""
        try:
            return await self._request("GET", path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def get_stream(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get(self._stream_path(namespace, name))

    async def patch_stream_status(self, namespace: str, name: str, status: dict[str, Any],
                                  resource_version: str | None) -> dict[str, Any]:
        return await self._patch_status(self._stream_path(namespace, name), status, resource_version)

    async def _patch_status(self, path: str, status: dict[str, Any], resource_version: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {"status": status}
        if resource_version:
            # A merge patch carrying resourceVersion is refused (409) if the object moved on.
            body["metadata"] = {"resourceVersion": resource_version}
        result = await self._request("PATCH", path + "/status", body,
                                     {"fieldManager": FIELD_MANAGER}, "application/merge-patch+json")
        return result or {}

    # -- snapshots ------------------------------------------------------------
    def _snapshots_path(self, namespace: str) -> str:
        return f"/apis/{self.GROUP_VERSION}/namespaces/{quote(namespace)}/{self.SNAPSHOT_PLURAL}"

    async def list_snapshots(self, namespace: str, stream: str) -> list[dict[str, Any]]:
        """The ExactlyOnceSnapshots labelled as the stream's (snapshots.snapshot_resource sets the label)."""
        result = await self._request("GET", self._snapshots_path(namespace),
                                     query={"labelSelector": selector_string({LABEL_STREAM: stream})})
        return list((result or {}).get("items") or [])

    async def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One Secret a stream references by name, in the stream's namespace (never listed or watched)."""
        return await self._get(f"/api/v1/namespaces/{quote(namespace)}/secrets/{quote(name)}")

    async def get_snapshot(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get(f"{self._snapshots_path(namespace)}/{quote(name)}")

    async def create_snapshot(self, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """The created snapshot (None: it was there already, which a deterministic name makes success)."""
        try:
            return await self._request("POST", self._snapshots_path(namespace), body,
                                       {"fieldManager": FIELD_MANAGER})
        except KubeError as exc:
            if exc.status != 409:
                raise
            return None

    async def delete_snapshot(self, namespace: str, name: str) -> None:
        # Background: the snapshot goes first (after its finalizer disposed the files), its Pods after it.
        await self._delete(f"{self._snapshots_path(namespace)}/{quote(name)}")

    async def patch_snapshot_status(self, namespace: str, name: str, status: dict[str, Any],
                                    resource_version: str | None) -> dict[str, Any]:
        return await self._patch_status(f"{self._snapshots_path(namespace)}/{quote(name)}", status,
                                        resource_version)

    # -- pods -----------------------------------------------------------------
    async def list_driver_pods(self, namespace: str, stream: str) -> list[dict[str, Any]]:
        return await self.list_pods(namespace, stream_selector(stream))

    async def list_pods(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        """Pods carrying every one of ``labels`` (equality selector)."""
        result = await self._request("GET", f"/api/v1/namespaces/{quote(namespace)}/pods",
                                     query={"labelSelector": selector_string(labels)})
        return list((result or {}).get("items") or [])

    async def get_node(self, name: str) -> dict[str, Any] | None:
        """A Node by name (cluster-scoped; None: there is none). Read only for a driver Pod that looks unwell."""
        return await self._get(f"/api/v1/nodes/{quote(name)}")

    async def _find_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        # A list by name, not a GET: the operator's Role may list Pods but not get them.
        result = await self._request("GET", f"/api/v1/namespaces/{quote(namespace)}/pods",
                                     query={"fieldSelector": f"metadata.name={name}"})
        return next(iter((result or {}).get("items") or []), None)

    async def create_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """Create and return the Pod; a 409 is success (the deterministic name: a repeated create; None) when
        the Pod there is ours, NameTaken when it is someone else's."""
        try:
            return await self._request("POST", f"/api/v1/namespaces/{quote(namespace)}/pods", body,
                                       {"fieldManager": FIELD_MANAGER})
        except KubeError as exc:
            if exc.status != 409:
                raise
            if owner_uids(body):
                current = await self._find_pod(namespace, body["metadata"]["name"])
                if current is not None:  # gone meanwhile: the next pass observes and decides again
                    refuse_unless_ours("Pod", namespace, body, current)
            return None

    async def delete_pod(self, namespace: str, name: str, grace_seconds: int, owner_uid: str | None = None) -> None:
        """Delete a Pod; with ``owner_uid`` only if that uid owns it (see _delete_owned)."""
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}"
        options = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": grace_seconds}
        if owner_uid is None:
            await self._delete(path, options)
        else:
            await self._delete_owned("Pod", path, await self._find_pod(namespace, name), owner_uid, options)

    async def _delete(self, path: str, options: dict[str, Any] | None = None) -> None:
        try:
            await self._request("DELETE", path, options or {"kind": "DeleteOptions", "apiVersion": "v1",
                                                             "propagationPolicy": "Background"})
        except KubeError as exc:
            if exc.status != 404:
                raise

    async def _delete_owned(self, kind: str, path: str, current: dict[str, Any] | None, owner_uid: str,
                            options: dict[str, Any] | None = None) -> None:
        """Delete ``current`` (as read at ``path``) if ``owner_uid`` owns it; else leave it and warn. The uid
        precondition makes the server refuse (409) if the object was replaced since it was read."""
        if current is None:
            return
        meta = current.get("metadata") or {}
        if owner_uid not in owner_uids(current):
            log.warning("not deleting %s %s/%s: it belongs to %s, not to uid %s", kind, meta.get("namespace"),
                        meta.get("name"), owners_text(current), owner_uid)
            return
        options = {**(options or {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}),
                   "preconditions": {"uid": meta.get("uid")}}
        try:
            await self._request("DELETE", path, options)
        except KubeError as exc:
            if exc.status == 409:   # replaced since read: the new object is not the one we own
                log.warning("not deleting %s %s/%s: replaced since it was read", kind, meta.get("namespace"),
                            meta.get("name"))
            elif exc.status != 404:
                raise

    # -- config map and service ------------------------------------------------
    async def _apply(self, namespace: str, collection: str, body: dict[str, Any]) -> None:
        """Create, or replace the existing object of that name if it is ours (else NameTaken)."""
        name = body["metadata"]["name"]
        try:
            await self._request("POST", collection, body, {"fieldManager": FIELD_MANAGER})
            return
        except KubeError as exc:
            if exc.status != 409:
                raise
        current = await self._request("GET", f"{collection}/{quote(name)}") or {}
        refuse_unless_ours(body.get("kind") or "object", namespace, body, current)
        merged = json.loads(json.dumps(body))
        merged["metadata"]["resourceVersion"] = (current.get("metadata") or {}).get("resourceVersion")
        if body.get("kind") == "Service":
            # clusterIP is immutable; keep what the server has.
            merged["spec"]["clusterIP"] = (current.get("spec") or {}).get("clusterIP", "None")
        await self._request("PUT", f"{collection}/{quote(name)}", merged, {"fieldManager": FIELD_MANAGER})

    async def apply_config_map(self, namespace: str, body: dict[str, Any]) -> None:
        await self._apply(namespace, f"/api/v1/namespaces/{quote(namespace)}/configmaps", body)

    async def apply_service(self, namespace: str, body: dict[str, Any]) -> None:
        await self._apply(namespace, f"/api/v1/namespaces/{quote(namespace)}/services", body)

    async def get_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get(f"/api/v1/namespaces/{quote(namespace)}/services/{quote(name)}")

    async def delete_config_map(self, namespace: str, name: str, owner_uid: str) -> None:
        path = f"/api/v1/namespaces/{quote(namespace)}/configmaps/{quote(name)}"
        await self._delete_owned("ConfigMap", path, await self._get(path), owner_uid)

    async def delete_service(self, namespace: str, name: str, owner_uid: str) -> None:
        path = f"/api/v1/namespaces/{quote(namespace)}/services/{quote(name)}"
        await self._delete_owned("Service", path, await self._get(path), owner_uid)

    # -- events ---------------------------------------------------------------
    async def post_event(self, ref: ObjectRef, type_: str, reason: str, message: str, *,
                         kind: str | None = None) -> None:
        """An event on the stream (a StreamRef) or on another of our objects: ``kind``, else ``ref.kind``."""
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        key = (ref.namespace, ref.uid, event_kind(ref, kind), type_, reason, message[:1024])
        seen = self.events.recent(key)
        if seen is not None:   # the same again: count it on the Event already there (events.py)
            path = f"/api/v1/namespaces/{quote(ref.namespace)}/events/{quote(seen.name)}"
            try:
                await self._request("PATCH", path, {"count": seen.count + 1, "lastTimestamp": stamp},
                                    content_type="application/merge-patch+json")
                self.events.posted(key, seen.name, seen.count + 1, seen.first)
                return
            except KubeError as exc:   # gone (expired, deleted): post a new one
                self.events.forget(key)
                if exc.status != 404:
                    log.warning("could not count event %s for %s/%s again: %s", reason, ref.namespace, ref.name, exc)
                    return
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{ref.name}.", "namespace": ref.namespace},
            "involvedObject": {"apiVersion": self.GROUP_VERSION, "kind": event_kind(ref, kind),
                               "name": ref.name, "namespace": ref.namespace, "uid": ref.uid},
            "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": FIELD_MANAGER},
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        }
        try:
            created = await self._request("POST", f"/api/v1/namespaces/{quote(ref.namespace)}/events", body)
            name = ((created or {}).get("metadata") or {}).get("name")
            if name:
                self.events.posted(key, name, 1, stamp)
        except KubeError as exc:  # an event is never worth failing a reconcile for
            log.warning("could not post event %s for %s/%s: %s", reason, ref.namespace, ref.name, exc)


def verb_and_resource(method: str, path: str, query: dict[str, str] | None = None) -> tuple[str, str]:
    """The Kubernetes verb and resource of a request (``GET .../pods`` -> ``("list", "pods")``, ``PATCH
    .../exactlyoncestreams/<name>/status`` -> ``("patch", "exactlyoncestreams/status")``, ``GET /api/v1/pods``
    with watch=true -> ``("watch", "pods")``): metric labels, never a namespace or a name."""
    parts = path.split("?")[0].strip("/").split("/")
    if "namespaces" in parts:
        rest = parts[parts.index("namespaces") + 2:]        # plural[/name[/sub]]
    else:                                                   # cluster-wide: /api/v1/<plural>, /apis/<g>/<v>/<plural>
        rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    resource = "/".join(rest[:1] + rest[2:3]) or "other"
    listing = "watch" if (query or {}).get("watch") == "true" else "list"
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
        method.upper(), listing if len(rest) == 1 else "get")
    return verb, resource


def event_kind(ref: Any, kind: str | None = None) -> str:
    """The involvedObject kind of an event about ``ref``: explicit, else the ref's own, else a stream."""
    return kind or getattr(ref, "kind", None) or KIND
