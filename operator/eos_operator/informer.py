"""Watch-driven reads: the reconcilers' Pods, streams and snapshots come from memory, not from a LIST per pass.

An :class:`Informer` keeps one collection in memory the way client-go's informers do: a LIST, then a WATCH
from the list's resourceVersion (with bookmarks), resumed from the last version it saw when the server ends
the stream, and listed afresh when that version is too old (410 Gone). :class:`WatchedKube` is the real
adapter (kube_api.KubernetesApi) with its reads answered by three informers, the operator's Pods (by the
``app.kubernetes.io/managed-by`` label, server-side), the ExactlyOnceStreams and the ExactlyOnceSnapshots;
its writes go to the API server as before.

Why reads from a cache stay safe here (the protocol's fencing is the last line, but the planner should not
need it):

* a write of ours is in the cache at once (write-through of the server's answer: a created Pod or snapshot,
  a patched status), so a pass never misses what the pass before it created;
* a cache behind the server errs towards "still there" (a Pod deleted meanwhile is seen until its DELETED
  event), which makes the planner wait, never start a second driver;
* a status patch refused as stale (409) drops that object's entry, so the next pass reads it with a GET;
* kopf hands each handler the body it just saw; :meth:`WatchedKube.offer` keeps it when it is newer, so a
  spec change is acted on at once, not at the informer's pace;
* until an informer's first LIST succeeded (or while it cannot list or watch, e.g. a Role without
  ``watch``), its reads go to the API server, with a warning naming the missing permission.
"""
from __future__ import annotations

import asyncio
import copy
import fnmatch
import json
import logging
import threading
import time
from typing import Any, Callable

from eos_job.snapshot_resource import SNAPSHOT_KIND, SNAPSHOT_PLURAL
from eos_job.spec import API_GROUP, API_VERSION, PLURAL

from .children import LABEL_MANAGED_BY, LABEL_STREAM, MANAGED_BY, selector_string
from .kube_api import KubernetesApi
from .kube_errors import Conflict

log = logging.getLogger(__name__)

Key = tuple[str, str]   # (namespace, name)
WATCH_SECONDS = 300     # the server ends each watch after this; the informer resumes from where it was
SYNC_WAIT_S = 10.0      # a read waits this long for the first LIST, then asks the server itself


def newer(candidate: dict[str, Any], current: dict[str, Any] | None) -> bool:
    """Whether ``candidate`` is a later version of the object than ``current``. Resource versions are opaque
    to clients in principle; every API server backed by etcd issues increasing integers, compared here, and
    anything else is taken as newer (the watch is the source of truth)."""
    if current is None:
        return True
    a, b = _rv(candidate), _rv(current)
    return not (a.isdigit() and b.isdigit()) or int(a) > int(b)


def _rv(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _key(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


def has_labels(obj: dict[str, Any], labels: dict[str, str]) -> bool:
    have = (obj.get("metadata") or {}).get("labels") or {}
    return all(have.get(k) == v for k, v in labels.items())


class Informer:
    """One watched collection at ``path`` (all namespaces, or one), optionally label-selected, kept by
    (namespace, name); ``accept`` keeps only the namespaces the operator serves (its globs)."""

    def __init__(self, api: KubernetesApi, path: str, *, what: str, selector: str | None = None,
                 accept: Callable[[str], bool] = lambda _ns: True, watch_seconds: int = WATCH_SECONDS):
        self.api, self.path, self.what, self.selector, self.accept = api, path, what, selector, accept
        self.watch_seconds = watch_seconds
        self._items: dict[Key, dict[str, Any]] = {}
        # The same objects by namespace, then by their stream label (None: none), so a reconcile's select
        # costs what its stream holds, not a scan of every stream's Pods (21 % of the operator's CPU at 500
        # streams before, benchmarks/results/2026-11-29-scale-kwok.md).
        self._index: dict[str, dict[str | None, dict[Key, dict[str, Any]]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.synced = threading.Event()     # the first LIST succeeded
        self.healthy = False                # the last LIST or WATCH call worked
        self.version: str | None = None     # where the watch resumes
        self._warned = False
        self._thread: threading.Thread | None = None
        self.listener: Callable[[str, dict[str, Any]], None] | None = None   # (event type, object), its thread

    # -- reads (any thread) -----------------------------------------------------
    def usable(self) -> bool:
        return self.synced.is_set() and self.healthy

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._items.get((namespace, name))

    def select(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        with self._lock:
            groups = self._index.get(namespace) or {}
            if LABEL_STREAM in labels:
                candidates = list((groups.get(labels[LABEL_STREAM]) or {}).values())
            else:
                candidates = [o for group in groups.values() for o in group.values()]
        return [o for o in candidates if has_labels(o, labels)]

    # -- the store and its index (callers hold the lock) -----------------------------------
    def _set(self, key: Key, obj: dict[str, Any]) -> None:
        self._pop(key)
        self._items[key] = obj
        stream = ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_STREAM)
        self._index.setdefault(key[0], {}).setdefault(stream, {})[key] = obj

    def _pop(self, key: Key) -> None:
        old = self._items.pop(key, None)
        if old is None:
            return
        stream = ((old.get("metadata") or {}).get("labels") or {}).get(LABEL_STREAM)
        groups = self._index.get(key[0]) or {}
        group = groups.get(stream) or {}
        group.pop(key, None)
        if not group:
            groups.pop(stream, None)
        if not groups:
            self._index.pop(key[0], None)

    def _replace_all(self, fresh: dict[Key, dict[str, Any]]) -> None:
        self._items, self._index = {}, {}
        for key, obj in fresh.items():
            self._set(key, obj)

    def put(self, obj: dict[str, Any] | None) -> None:
        """A version the operator got from the server itself (its own write, a GET): kept if newer."""
        if not obj or not (obj.get("metadata") or {}).get("name"):
            return
        key = _key(obj)
        if not self.accept(key[0]):
            return
        with self._lock:
            if newer(obj, self._items.get(key)):
                self._set(key, obj)

    def drop(self, namespace: str, name: str) -> None:
        with self._lock:
            self._pop((namespace, name))

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    # -- the watch loop (its own thread) ----------------------------------------------
    def start(self) -> "Informer":
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.what}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            try:
                if self.version is None:
                    self._list()
                self._watch()
                backoff = 1.0
            except Exception as exc:  # noqa: BLE001 - an informer never dies; reads fall back meanwhile
                self.healthy = False
                self._complain(exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _complain(self, exc: Exception) -> None:
        status = getattr(exc, "status", None)
        if status == 403 and not self._warned:
            self._warned = True
            log.warning("cannot list/watch %s (%s): the operator reads them with a request per reconcile "
                         "instead; grant list and watch on them (the chart's Role does)", self.what, exc)
        else:
            log.info("watch of %s interrupted (%s); resuming", self.what, exc)

    def _query(self, **extra: str) -> dict[str, str]:
        query = {"labelSelector": self.selector} if self.selector else {}
        return {**query, **extra}

    def _list(self) -> None:
        listed = self.api.request_sync("GET", self.path, query=self._query()) or {}
        version = str((listed.get("metadata") or {}).get("resourceVersion") or "")
        fresh = {_key(o): o for o in listed.get("items") or [] if self.accept(_key(o)[0])}
        with self._lock:
            # Keep what the operator wrote after the list was taken (write-through of a later version).
            for key, obj in self._items.items():
                if key not in fresh and version.isdigit() and _rv(obj).isdigit() and int(_rv(obj)) > int(version):
                    fresh[key] = obj
            self._replace_all(fresh)
        self.version = version or None
        self.healthy = True
        self.synced.set()

    def _watch(self) -> None:
        query = self._query(watch="true", allowWatchBookmarks="true", timeoutSeconds=str(self.watch_seconds))
        if self.version:
            query["resourceVersion"] = self.version
        events = self.api.watch_sync(self.path, query, read_timeout=self.watch_seconds + 30)
        self.healthy = True   # the server took the watch: the cache follows it again
        for event in events:
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:   # too old: list again
                    self.version = None
                    return
                raise RuntimeError(f"watch error: {obj.get('message') or obj}")
            version = _rv(obj)
            if kind == "BOOKMARK":
                self.version = version or self.version
                continue
            key = _key(obj)
            if self.accept(key[0]):
                with self._lock:
                    if kind == "DELETED":
                        self._pop(key)
                    elif newer(obj, self._items.get(key)):
                        self._set(key, obj)
                if self.listener is not None:
                    try:
                        self.listener(kind, obj)
                    except Exception:  # noqa: BLE001 - a listener never stops the watch
                        log.exception("listener of %s failed", self.what)
            self.version = version or self.version


def namespace_filter(namespaces: tuple[str, ...]) -> Callable[[str], bool]:
    """kopf's namespace patterns: globs, ``!glob`` excludes; none at all means every namespace."""
    include = [p for p in namespaces if not p.startswith("!")]
    exclude = [p[1:] for p in namespaces if p.startswith("!")]

    def accept(ns: str) -> bool:
        return ((not include or any(fnmatch.fnmatchcase(ns, p) for p in include))
                and not any(fnmatch.fnmatchcase(ns, p) for p in exclude))
    return accept


class WatchedKube(KubernetesApi):
    """The real adapter with watch-driven reads (see the module docstring). ``namespaces``: the operator's
    ``--namespace`` patterns (empty: all); exact names get one informer each per collection (a namespaced
    install's Roles allow nothing wider), patterns a cluster-wide watch filtered here."""

    def __init__(self, api_client: Any, namespaces: tuple[str, ...] = (), *, exact: bool = False,
                 sync_wait_s: float = SYNC_WAIT_S, **kwargs: Any):
        super().__init__(api_client, **kwargs)
        self.sync_wait_s = sync_wait_s
        scopes = [(ns, f"/namespaces/{ns}") for ns in namespaces] if exact else [(None, "")]
        accept = (lambda _ns: True) if exact else namespace_filter(namespaces)
        managed = selector_string({LABEL_MANAGED_BY: MANAGED_BY})
        group = f"/apis/{API_GROUP}/{API_VERSION}"
        self.informers: dict[str, dict[str | None, Informer]] = {"pods": {}, PLURAL: {}, SNAPSHOT_PLURAL: {}}
        for ns, scope in scopes:
            where = ns or "all namespaces"
            self.informers["pods"][ns] = Informer(self, f"/api/v1{scope}/pods", what=f"pods in {where}",
                                                  selector=managed, accept=accept)
            self.informers[PLURAL][ns] = Informer(self, f"{group}{scope}/{PLURAL}", what=f"{PLURAL} in {where}",
                                                  accept=accept)
            self.informers[SNAPSHOT_PLURAL][ns] = Informer(self, f"{group}{scope}/{SNAPSHOT_PLURAL}",
                                                           what=f"{SNAPSHOT_PLURAL} in {where}", accept=accept)

    def start(self) -> "WatchedKube":
        for by_scope in self.informers.values():
            for informer in by_scope.values():
                informer.start()
        return self

    def stop(self) -> None:
        for by_scope in self.informers.values():
            for informer in by_scope.values():
                informer.stop()

    def _informer(self, collection: str, namespace: str) -> Informer | None:
        by_scope = self.informers[collection]
        informer = by_scope[namespace] if namespace in by_scope else by_scope.get(None)   # (an empty one is falsy)
        return informer if informer is not None and informer.accept(namespace) else None

    async def _ready(self, collection: str, namespace: str) -> Informer | None:
        """The informer answering reads of ``collection`` in ``namespace``, once it has listed; None: ask
        the server (outside its scope, not listed within ``sync_wait_s``, or unable to watch)."""
        informer = self._informer(collection, namespace)
        if informer is None:
            return None
        deadline = time.monotonic() + self.sync_wait_s
        while not informer.synced.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return informer if informer.usable() else None

    def listen(self, poke: Callable[[str, str], None]) -> None:
        """Call ``poke(namespace, stream)`` (from a watch thread) whenever one of a stream's Pods changes:
        a driver that failed is acted on at once, not at the next timer tick."""
        def on_pod(_kind: str, obj: dict[str, Any]) -> None:
            stream = ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_STREAM)
            if stream:
                poke(_key(obj)[0], stream)
        for informer in self.informers["pods"].values():
            informer.listener = on_pod

    def stream_uid(self, namespace: str, name: str) -> str | None:
        informer = self._informer(PLURAL, namespace)
        obj = informer.get(namespace, name) if informer is not None else None
        return (obj or {}).get("metadata", {}).get("uid")

    # -- streams ------------------------------------------------------------------
    def offer(self, obj: dict[str, Any]) -> None:
        """A stream's or a snapshot's body as kopf just saw it (handlers): kept if newer than the cached one.
        kopf may see a change first (a deletion: the handler must not read the object as it was before)."""
        collection = SNAPSHOT_PLURAL if obj.get("kind") == SNAPSHOT_KIND else PLURAL
        informer = self._informer(collection, _key(obj)[0])
        if informer is not None:
            informer.put(json.loads(json.dumps(obj)))

    async def get_stream(self, namespace: str, name: str) -> dict[str, Any] | None:
        informer = await self._ready(PLURAL, namespace)
        cached = informer.get(namespace, name) if informer is not None else None
        if cached is not None:
            return copy.deepcopy(cached)
        obj = await super().get_stream(namespace, name)   # not seen yet (just created) or gone
        if informer is not None:
            informer.put(obj)
        return obj

    async def list_streams(self, namespace: str) -> list[dict[str, Any]]:
        informer = await self._ready(PLURAL, namespace)
        return informer.select(namespace, {}) if informer is not None else await super().list_streams(namespace)

    async def patch_stream_status(self, namespace: str, name: str, status: dict[str, Any],
                                  resource_version: str | None) -> dict[str, Any]:
        return await self._patched(PLURAL, namespace, name,
                                   super().patch_stream_status(namespace, name, status, resource_version))

    async def _patched(self, collection: str, namespace: str, name: str, call) -> dict[str, Any]:
        informer = self._informer(collection, namespace)
        try:
            result = await call
        except Conflict:
            if informer is not None:
                informer.drop(namespace, name)   # stale here: the next read asks the server
            raise
        if informer is not None:
            informer.put(result)
        return result

    # -- snapshots ----------------------------------------------------------------
    async def list_snapshots(self, namespace: str, stream: str) -> list[dict[str, Any]]:
        informer = await self._ready(SNAPSHOT_PLURAL, namespace)
        if informer is None:
            return await super().list_snapshots(namespace, stream)
        return informer.select(namespace, {LABEL_STREAM: stream})

    async def get_snapshot(self, namespace: str, name: str) -> dict[str, Any] | None:
        informer = await self._ready(SNAPSHOT_PLURAL, namespace)
        cached = informer.get(namespace, name) if informer is not None else None
        if cached is not None:
            return copy.deepcopy(cached)
        obj = await super().get_snapshot(namespace, name)
        if informer is not None:
            informer.put(obj)
        return obj

    async def create_snapshot(self, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
        created = await super().create_snapshot(namespace, body)
        informer = self._informer(SNAPSHOT_PLURAL, namespace)
        if informer is not None:
            informer.put(created)
        return created

    async def patch_snapshot_status(self, namespace: str, name: str, status: dict[str, Any],
                                    resource_version: str | None) -> dict[str, Any]:
        return await self._patched(SNAPSHOT_PLURAL, namespace, name,
                                   super().patch_snapshot_status(namespace, name, status, resource_version))

    # -- pods -----------------------------------------------------------------------
    async def list_pods(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        informer = None
        if labels.get(LABEL_MANAGED_BY) == MANAGED_BY:   # within the informer's server-side selector
            informer = await self._ready("pods", namespace)
        if informer is None:
            return await super().list_pods(namespace, labels)
        return informer.select(namespace, labels)

    async def create_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
        created = await super().create_pod(namespace, body)
        informer = self._informer("pods", namespace)
        if informer is not None:
            informer.put(created)
        return created

