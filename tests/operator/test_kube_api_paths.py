"""A name from a spec is one segment of an API path: '/' escaped, '.' and '..' refused (a restoreFrom such as
``../../<namespace>/exactlyoncesnapshots/<name>`` never reads another namespace's snapshot)."""
from __future__ import annotations

import asyncio

import pytest

from eos_operator.kube_api import KubernetesApi, quote


class _Recorder(KubernetesApi):
    def __init__(self):
        super().__init__(api_client=None, threads=1)
        self.paths: list[str] = []

    async def _request(self, method, path, body=None, query=None, *args, **kwargs):
        self.paths.append(path)
        return {}


def test_a_name_with_slashes_stays_in_its_namespace():
    api = _Recorder()
    asyncio.run(api.get_snapshot("team-a", "../../team-b/exactlyoncesnapshots/prod"))
    asyncio.run(api.read_secret("team-a", "../../team-b/secrets/keys"))
    assert api.paths == [
        "/apis/streaming.eos.dev/v1beta1/namespaces/team-a/exactlyoncesnapshots/"
        "..%2F..%2Fteam-b%2Fexactlyoncesnapshots%2Fprod",
        "/api/v1/namespaces/team-a/secrets/..%2F..%2Fteam-b%2Fsecrets%2Fkeys"]


def test_dot_segments_are_no_names():
    assert quote("colors-p1") == "colors-p1" and quote("a.b") == "a.b"
    for name in (".", ".."):
        with pytest.raises(ValueError):
            quote(name)
