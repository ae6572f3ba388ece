"""Watch-driven reads (informer.py): the reconcilers' reads cost no request per pass, and a cache behind the
server never hides the operator's own writes, never forgets a Pod early, and recovers from a stale status
patch, an expired watch and a missing permission. The API server here is a small in-memory one speaking the
same paths, queries and watch events as the real one (the e2e tests run the informers against the real one)."""
from __future__ import annotations

import asyncio
import copy
import logging
import queue
import time

import pytest

from eos_operator.children import stream_selector
from eos_operator.informer import WatchedKube, namespace_filter, newer
from eos_operator.kube_api import verb_and_resource
from eos_operator.kube_errors import Conflict, KubeError

pytestmark = pytest.mark.unit

G = "/apis/streaming.eos.dev/v1beta1"


def pod(ns: str, name: str, stream: str = "s", phase: str = "Running") -> dict:
    return {"metadata": {"name": name, "namespace": ns, "labels": stream_selector(stream)},
            "status": {"phase": phase}}


def stream(ns: str, name: str) -> dict:
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "generation": 1},
            "spec": {}, "status": {}}


class Server:
    """Objects by (plural, namespace, name), resourceVersions from one counter, watch events to every open
    watch of the plural. ``hold`` keeps events back (a slow watch); ``deny`` answers a WATCH with 403 (a Role
    with list but no watch)."""

    def __init__(self):
        self.rv = 100
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.watches: list[tuple[str, queue.Queue]] = []
        self.requests: list[tuple[str, str, str]] = []   # (method, path, "watch"|"")
        self.hold = False
        self.held: list[tuple[str, str, dict]] = []
        self.deny = False
        self.expire_next_watch = False

    def store(self, plural: str, obj: dict, kind: str = "ADDED", notify: bool = True) -> dict:
        self.rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        meta = obj["metadata"]
        key = (plural, meta["namespace"], meta["name"])
        if kind == "DELETED":
            self.objects.pop(key, None)
        else:
            self.objects[key] = obj
        if notify:
            self.notify(plural, kind, obj)
        return obj

    def notify(self, plural: str, kind: str, obj: dict) -> None:
        if self.hold:
            self.held.append((plural, kind, obj))
            return
        for p, q in list(self.watches):
            if p == plural:
                q.put({"type": kind, "object": copy.deepcopy(obj)})

    def release(self) -> None:
        self.hold, held = False, self.held
        self.held = []
        for event in held:
            self.notify(*event)

    @staticmethod
    def parse(path: str) -> tuple[str, str | None, str | None, str | None]:
        parts = path.strip("/").split("/")
        ns = None
        if "namespaces" in parts:
            i = parts.index("namespaces")
            ns, rest = parts[i + 1], parts[i + 2:]
        else:
            rest = parts[2:] if parts[0] == "api" else parts[3:]
        return rest[0], ns, (rest[1] if len(rest) > 1 else None), (rest[2] if len(rest) > 2 else None)

    def items(self, plural: str, ns: str | None, selector: str | None) -> list[dict]:
        want = dict(kv.split("=", 1) for kv in selector.split(",")) if selector else {}
        return [copy.deepcopy(o) for (p, n, _), o in self.objects.items()
                if p == plural and (ns is None or n == ns)
                and all((o["metadata"].get("labels") or {}).get(k) == v for k, v in want.items())]


class FakeKube(WatchedKube):
    """The real WatchedKube with its two transport calls answered by ``server``."""

    def __init__(self, server: Server, namespaces=(), exact=False, sync_wait_s=2.0):
        self.server = server
        super().__init__(api_client=None, namespaces=namespaces, exact=exact, sync_wait_s=sync_wait_s)

    def request_sync(self, method, path, body=None, query=None, content_type="application/json"):
        s = self.server
        s.requests.append((method, path, ""))
        plural, ns, name, sub = s.parse(path)
        if method == "GET" and name is None:
            return {"metadata": {"resourceVersion": str(s.rv)},
                    "items": s.items(plural, ns, (query or {}).get("labelSelector"))}
        current = s.objects.get((plural, ns, name))
        if method == "GET":
            if current is None:
                raise KubeError(404, "not found")
            return copy.deepcopy(current)
        if method == "POST":
            if (plural, ns, body["metadata"]["name"]) in s.objects:
                raise Conflict(409, "already exists")
            return s.store(plural, {**body, "metadata": {**body["metadata"], "namespace": ns}})
        if method == "PATCH" and sub == "status":
            wanted = (body.get("metadata") or {}).get("resourceVersion")
            if wanted and wanted != current["metadata"]["resourceVersion"]:
                raise Conflict(409, "the object has been modified")
            return s.store(plural, {**current, "status": {**current.get("status", {}), **body["status"]}},
                           kind="MODIFIED")
        if method == "DELETE":
            return {}
        raise AssertionError(f"unexpected {method} {path}")

    def watch_sync(self, path, query, read_timeout):
        s = self.server
        s.requests.append(("GET", path, "watch"))
        if s.deny:
            raise KubeError(403, "forbidden: cannot watch")
        plural, ns, _, _ = s.parse(path)
        if s.expire_next_watch:
            s.expire_next_watch = False
            return iter([{"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}])
        q: queue.Queue = queue.Queue()
        s.watches.append((plural, q))
        return self._events(plural, ns, q)

    def _events(self, plural, ns, q):
        s = self.server
        try:
            while True:
                event = q.get()
                if event is None:
                    return
                obj_ns = event["object"]["metadata"]["namespace"]
                if ns is None or obj_ns == ns:
                    yield event
        finally:
            s.watches.remove((plural, q))

    def end_watches(self) -> None:
        for _, q in list(self.server.watches):
            q.put(None)


def eventually(check, timeout: float = 3.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@pytest.fixture
def server():
    s = Server()
    s.store("pods", pod("ns", "s-driver-1"))
    s.store("exactlyoncestreams", stream("ns", "s"))
    return s


@pytest.fixture
def kube(server):
    k = FakeKube(server).start()
    yield k
    k.stop()
    k.end_watches()


def reads(server: Server) -> list[tuple[str, str, str]]:
    return [r for r in server.requests if r[2] != "watch"]


def test_passes_read_from_the_watches_not_with_a_request_each(kube, server):
    async def passes():
        for _ in range(20):
            assert (await kube.get_stream("ns", "s"))["metadata"]["uid"] == "uid-s"
            assert [p["metadata"]["name"] for p in await kube.list_driver_pods("ns", "s")] == ["s-driver-1"]
            assert await kube.list_snapshots("ns", "s") == []
            assert len(await kube.list_streams("ns")) == 1
    asyncio.run(passes())
    # one LIST per collection, whatever the number of passes
    assert sorted(p for m, p, _ in reads(server)) == sorted([
        "/api/v1/pods", f"{G}/exactlyoncestreams", f"{G}/exactlyoncesnapshots"])
    server.store("pods", pod("ns", "s-driver-1", phase="Failed"), kind="MODIFIED")
    eventually(lambda: asyncio.run(kube.list_driver_pods("ns", "s"))[0]["status"]["phase"] == "Failed")


def test_a_pod_the_operator_created_is_seen_before_its_watch_event(kube, server):
    asyncio.run(kube.list_driver_pods("ns", "s"))
    server.hold = True
    asyncio.run(kube.create_pod("ns", pod("ns", "s-driver-2")))
    names = {p["metadata"]["name"] for p in asyncio.run(kube.list_driver_pods("ns", "s"))}
    assert names == {"s-driver-1", "s-driver-2"}
    server.release()


def test_a_deleted_pod_is_seen_until_its_deleted_event(kube, server):
    asyncio.run(kube.list_driver_pods("ns", "s"))
    server.hold = True
    server.store("pods", pod("ns", "s-driver-1"), kind="DELETED")
    assert len(asyncio.run(kube.list_driver_pods("ns", "s"))) == 1   # errs towards "still there": wait
    server.release()
    eventually(lambda: asyncio.run(kube.list_driver_pods("ns", "s")) == [])


def test_a_stale_status_patch_makes_the_next_read_ask_the_server(kube, server):
    old = asyncio.run(kube.get_stream("ns", "s"))
    server.store("exactlyoncestreams", {**stream("ns", "s"), "spec": {"changed": True}}, kind="MODIFIED",
                 notify=False)   # the watch has not told us yet
    with pytest.raises(Conflict):
        asyncio.run(kube.patch_stream_status("ns", "s", {"x": 1}, old["metadata"]["resourceVersion"]))
    fresh = asyncio.run(kube.get_stream("ns", "s"))
    assert fresh["spec"] == {"changed": True}
    patched = asyncio.run(kube.patch_stream_status("ns", "s", {"x": 1}, fresh["metadata"]["resourceVersion"]))
    assert asyncio.run(kube.get_stream("ns", "s"))["metadata"]["resourceVersion"] == \
        patched["metadata"]["resourceVersion"]   # our own write, at once


def test_kopfs_body_is_taken_only_when_newer(kube, server):
    cached = asyncio.run(kube.get_stream("ns", "s"))
    older = copy.deepcopy(cached)
    older["metadata"]["resourceVersion"] = "1"
    older["spec"] = {"old": True}
    kube.offer(older)
    assert asyncio.run(kube.get_stream("ns", "s"))["spec"] == {}
    newer_body = server.store("exactlyoncestreams", {**stream("ns", "s"), "spec": {"new": True}}, kind="MODIFIED",
                              notify=False)
    kube.offer(newer_body)
    assert asyncio.run(kube.get_stream("ns", "s"))["spec"] == {"new": True}


def test_reads_are_copies(kube):
    got = asyncio.run(kube.get_stream("ns", "s"))
    got["spec"]["mutated"] = True
    assert "mutated" not in asyncio.run(kube.get_stream("ns", "s"))["spec"]


def test_an_expired_watch_lists_again(server):
    server.expire_next_watch = True
    k = FakeKube(server).start()
    try:
        asyncio.run(k.list_driver_pods("ns", "s"))
        eventually(lambda: sum(1 for m, p, w in server.requests if p == "/api/v1/pods" and not w) >= 2)
        server.store("pods", pod("ns", "s-driver-3"))
        eventually(lambda: len(asyncio.run(k.list_driver_pods("ns", "s"))) == 2)
    finally:
        k.stop()
        k.end_watches()


def test_without_list_or_watch_permission_reads_go_to_the_server(server, caplog):
    server.deny = True
    k = FakeKube(server, sync_wait_s=0.3).start()
    try:
        with caplog.at_level(logging.WARNING, logger="eos_operator.informer"):
            eventually(lambda: "grant list and watch" in caplog.text)
            assert [p["metadata"]["name"] for p in asyncio.run(k.list_driver_pods("ns", "s"))] == ["s-driver-1"]
            assert asyncio.run(k.get_stream("ns", "s"))["metadata"]["name"] == "s"
        assert ("GET", "/api/v1/namespaces/ns/pods", "") in server.requests
        assert ("GET", f"{G}/namespaces/ns/exactlyoncestreams/s", "") in server.requests
    finally:
        k.stop()


def test_exact_namespaces_watch_each_namespace_and_nothing_wider(server):
    server.store("pods", pod("other", "x-driver-1", stream="x"))
    k = FakeKube(server, namespaces=("ns",), exact=True).start()
    try:
        for _ in range(3):
            assert len(asyncio.run(k.list_driver_pods("ns", "s"))) == 1
            assert asyncio.run(k.list_snapshots("ns", "s")) == []     # an empty collection is still watched
        assert sorted(p for _, p, w in server.requests if not w) == sorted([
            "/api/v1/namespaces/ns/pods", f"{G}/namespaces/ns/exactlyoncestreams",
            f"{G}/namespaces/ns/exactlyoncesnapshots"])
        # a namespace it does not serve is asked directly, never answered from a wider watch
        asyncio.run(k.list_driver_pods("other", "x"))
        assert ("GET", "/api/v1/namespaces/other/pods", "") in server.requests
    finally:
        k.stop()
        k.end_watches()


def test_namespace_patterns():
    accept = namespace_filter(("team-*", "!team-secret"))
    assert accept("team-a") and not accept("team-secret") and not accept("other")
    assert namespace_filter(())("anything")


def test_newer_compares_versions_as_numbers():
    def v(rv):
        return {"metadata": {"resourceVersion": rv}}
    assert newer(v("10"), v("9")) and not newer(v("9"), v("10")) and not newer(v("9"), v("9"))
    assert newer(v("9"), None)


def test_requests_are_named_by_verb_and_resource():
    assert verb_and_resource("GET", "/api/v1/pods", {"watch": "true"}) == ("watch", "pods")
    assert verb_and_resource("GET", "/api/v1/pods") == ("list", "pods")
    assert verb_and_resource("GET", f"{G}/exactlyoncestreams") == ("list", "exactlyoncestreams")
    assert verb_and_resource("GET", f"{G}/namespaces/a/exactlyoncestreams/s") == ("get", "exactlyoncestreams")
    assert verb_and_resource("PATCH", f"{G}/namespaces/a/exactlyoncestreams/s/status") == \
        ("patch", "exactlyoncestreams/status")


def test_a_change_to_a_streams_pod_pokes_that_stream(kube, server):
    poked: list[tuple[str, str]] = []
    kube.listen(lambda ns, name: poked.append((ns, name)))
    asyncio.run(kube.list_driver_pods("ns", "s"))
    server.store("pods", pod("ns", "s-driver-1", phase="Failed"), kind="MODIFIED")
    eventually(lambda: poked == [("ns", "s")])
    assert kube.stream_uid("ns", "s") == "uid-s" and kube.stream_uid("ns", "nope") is None


def test_kopfs_body_of_a_snapshot_being_deleted_is_taken(kube, server):
    """kopf may see a deletion before the operator's own watch: the dispose handler offers kopf's body, and
    the snapshot reconciler must read it as deleting, or it would let the snapshot go with its files kept."""
    snap = server.store("exactlyoncesnapshots", {"kind": "ExactlyOnceSnapshot",
                                                 "metadata": {"name": "s-p1", "namespace": "ns",
                                                              "labels": {"streaming.eos.dev/stream": "s"}}})
    eventually(lambda: asyncio.run(kube.get_snapshot("ns", "s-p1")) is not None)
    deleting = server.store("exactlyoncesnapshots", {**snap, "metadata": {
        **snap["metadata"], "deletionTimestamp": "2026-11-25T07:45:40Z"}}, kind="MODIFIED", notify=False)
    kube.offer(deleting)
    assert asyncio.run(kube.get_snapshot("ns", "s-p1"))["metadata"].get("deletionTimestamp")
    assert asyncio.run(kube.get_stream("ns", "s"))["metadata"].get("deletionTimestamp") is None


def test_select_by_stream_from_the_index_agrees_with_a_scan():
    """The index by namespace and stream label answers what a scan of every object would, through sets,
    label changes (an object moving between streams), deletes and a fresh LIST."""
    import random

    from eos_operator.children import LABEL_STREAM
    from eos_operator.informer import Informer, has_labels

    informer = Informer(None, "/api/v1/pods", what="pods")
    rnd, truth = random.Random(7), {}
    for step in range(3000):
        key = (rnd.choice(["a", "b", "c"]), f"p{rnd.randrange(40)}")
        if rnd.random() < 0.25:
            informer.drop(*key)
            truth.pop(key, None)
        else:
            obj = pod(key[0], key[1], stream=rnd.choice(["s1", "s2", "s3"]))
            obj["metadata"]["resourceVersion"] = str(step + 1)
            informer.put(obj)
            truth[key] = obj
        if step == 2000:   # a relist replaces everything
            informer._replace_all(dict(truth))
        ns, labels = rnd.choice(["a", "b", "c", "z"]), rnd.choice([{}, {LABEL_STREAM: "s1"}, {LABEL_STREAM: "s3"}])
        want = sorted(o["metadata"]["name"] for (n, _), o in truth.items() if n == ns and has_labels(o, labels))
        assert sorted(o["metadata"]["name"] for o in informer.select(ns, labels)) == want, step
    assert len(informer) == len(truth)
