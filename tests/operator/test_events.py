"""Event aggregation (events.py, KubernetesApi.post_event): the same event again is a count."""
from __future__ import annotations

import asyncio
import json

from eos_operator.children import StreamRef
from eos_operator.events import EventCache
from eos_operator.kube_api import KubernetesApi


class _Response:
    def __init__(self, status: int, payload):
        self.status, self.data = status, json.dumps(payload).encode()

    def read(self) -> None:
        pass


class EventServer:
    """The API server's events, as far as post_event uses them."""

    def __init__(self):
        self.events: dict[str, dict] = {}
        self.requests: list[tuple[str, str]] = []

    def param_serialize(self, method, resource_path, query_params=None, header_params=None, body=None, **_):
        return method, resource_path, header_params, body, []

    def call_api(self, method, url, header_params=None, body=None, **_):
        self.requests.append((method, url))
        if method == "POST":
            name = f"{body['metadata']['generateName']}{len(self.events)}"
            self.events[name] = {**body, "metadata": {"name": name}}
            return _Response(201, self.events[name])
        name = url.rsplit("/", 1)[-1]
        if name not in self.events:
            return _Response(404, {"message": "not found"})
        assert header_params["Content-Type"] == "application/merge-patch+json"
        self.events[name].update(body)
        return _Response(200, self.events[name])


def test_a_repeated_event_counts_on_the_first_and_a_different_one_is_new():
    server = EventServer()
    api = KubernetesApi(server)
    ref = StreamRef("colors", "team", "uid-1")

    async def drive():
        for _ in range(5):
            await api.post_event(ref, "Warning", "DriverFailed", "exit code 137")
        await api.post_event(ref, "Warning", "DriverFailed", "exit code 1")        # another message
        await api.post_event(StreamRef("other", "team", "uid-2"), "Warning", "DriverFailed", "exit code 137")

    asyncio.run(drive())
    assert [m for m, _ in server.requests] == ["POST", "PATCH", "PATCH", "PATCH", "PATCH", "POST", "POST"]
    first = server.events["colors.0"]
    assert first["count"] == 5 and first["message"] == "exit code 137"
    assert first["firstTimestamp"] <= first["lastTimestamp"]
    assert len(server.events) == 3


def test_an_event_gone_from_the_server_is_posted_again():
    server = EventServer()
    api = KubernetesApi(server)
    ref = StreamRef("colors", "team", "uid-1")
    asyncio.run(api.post_event(ref, "Normal", "Running", "ok"))
    server.events.clear()      # expired (the API server's event TTL) or deleted
    asyncio.run(api.post_event(ref, "Normal", "Running", "ok"))
    assert [m for m, _ in server.requests] == ["POST", "PATCH", "POST"]
    assert len(server.events) == 1 and next(iter(server.events.values()))["count"] == 1


def test_the_cache_forgets_after_the_window_and_stays_bounded():
    now = [0.0]
    cache = EventCache(clock=lambda: now[0], window=600, max_entries=3)
    key = ("team", "uid-1", "ExactlyOnceStream", "Warning", "DriverFailed", "x")
    cache.posted(key, "e1", 1, "t")
    now[0] = 599
    assert cache.recent(key).name == "e1"
    now[0] = 1300
    assert cache.recent(key) is None and len(cache) == 0
    for i in range(5):
        cache.posted(("team", f"uid-{i}", "K", "Normal", "R", "m"), f"e{i}", 1, "t")
    assert len(cache) == 3 and cache.recent(("team", "uid-0", "K", "Normal", "R", "m")) is None
    cache.forget_object("team", "uid-4")
    assert len(cache) == 2
