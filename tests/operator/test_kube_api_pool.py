"""The operator's API calls do not queue behind blocked Kafka work in the default thread pool."""
from __future__ import annotations

import asyncio
import json
import threading

from eos_operator.adapters import KubernetesApi


class _Response:
    status = 200

    def __init__(self, body: dict):
        self.data = json.dumps(body).encode()

    def read(self) -> None:
        pass


class _FakeApiClient:
    """The two kubernetes.client.ApiClient methods KubernetesApi uses; records the calling thread."""

    def __init__(self):
        self.threads: list[str] = []
        self.timeouts: list = []

    def param_serialize(self, method, resource_path, query_params, header_params, body, auth_settings):
        return method, resource_path, header_params, body, []

    def call_api(self, method, url, header_params, body, post_params, _request_timeout):
        self.threads.append(threading.current_thread().name)
        self.timeouts.append(_request_timeout)
        return _Response({"items": [{"metadata": {"name": "colors"}}]})


def test_api_calls_complete_while_the_default_pool_is_blocked():
    fake = _FakeApiClient()
    api = KubernetesApi(fake)
    release = threading.Event()

    async def scenario():
        # Hold every thread of the default pool, as uncancellable Kafka reads past their timeout do.
        loop = asyncio.get_running_loop()
        blockers = [loop.run_in_executor(None, release.wait, 30) for _ in range(64)]
        try:
            return await asyncio.wait_for(api.list_streams("ns"), timeout=10)
        finally:
            release.set()
            await asyncio.gather(*blockers)

    items = asyncio.run(scenario())
    assert [i["metadata"]["name"] for i in items] == ["colors"]
    assert fake.threads and all(t.startswith("kube-api") for t in fake.threads)
    # A dead API server fails the connect quickly; a slow answer still has the read timeout.
    assert fake.timeouts == [(KubernetesApi.CONNECT_TIMEOUT_S, KubernetesApi.READ_TIMEOUT_S)]
