"""The chart-identity test's filter for refused requests (tests/chart/rbac_model.py).

The stack test fails when the operator's log holds a refusal; these cases pin what counts
as one, so the filter neither misses a refusal nor reads one into a timestamp.
"""
from __future__ import annotations

from tests.chart.rbac_model import refused_requests

TS = "2026-11-28 17:37:46,403"


def test_a_timestamp_or_a_duration_of_403_is_not_a_refusal():
    log = "\n".join([
        f"{TS} INFO eos_job.fencing: fenced 1 transactional ids in 34 ms (pool 1, dense)",
        "2026-11-28 17:37:46.403 INFO kopf.objects: Handler 'reconcile' succeeded.",
        f"{TS} INFO eos_job.fencing: fenced 2 transactional ids in 403 ms (pool 2, dense)",
        f"{TS} INFO eos_operator: batch 1403 committed",
    ])
    assert refused_requests(log) == []


def test_refusals_are_caught_in_each_form_the_clients_write():
    forbidden = (f"{TS} ERROR kopf.objects: Handler 'reconcile' failed: APIForbiddenError: ('configmaps is "
                 "forbidden: User \"system:serviceaccount:ns:op\" cannot create resource \"configmaps\"', {})")
    status = f"{TS} WARNING eos_operator.kube: POST https://127.0.0.1:6443/api/v1/namespaces/w/pods -> 403"
    aiohttp = (f"{TS} ERROR kopf._core: ClientResponseError: 403, message='Forbidden', "
               "url=URL('https://127.0.0.1:6443/apis/streaming.eos.dev/v1alpha1/exactlyoncestreams')")
    permission = f"{TS} ERROR eos_operator: no permission to patch exactlyoncestreams/status"
    assert refused_requests("\n".join([forbidden, status, aiohttp, permission])) == [
        forbidden, status, aiohttp, permission]


def test_kopf_scanning_and_its_fallbacks_are_the_allowed_refusals():
    scanning = (f"{TS} ERROR kopf._core: 403 Forbidden for "
                "GET https://127.0.0.1:6443/api/v1/namespaces?watch=true")
    fallback = (f"{TS} WARNING kopf._core: Not enough permissions to watch for namespaces: changes will not be "
                "noticed; the namespaces are only refreshed on operator restarts.")
    # the same refusal for a namespaced list is not kopf's scanning
    other = f"{TS} ERROR kopf._core: 403 Forbidden for GET https://127.0.0.1:6443/api/v1/namespaces/w/pods"
    assert refused_requests("\n".join([scanning, fallback, other])) == [other]
