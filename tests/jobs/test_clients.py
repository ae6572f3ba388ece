"""Shared Kafka clients (eos_job.clients): reused per cluster and credentials, one reader at a time."""
from __future__ import annotations

import pytest

from eos_job.clients import LEDGER, SOURCE, SharedClients

A = {"bootstrap.servers": "127.0.0.1:1"}                      # never contacted: nothing is read here
A_OTHER_USER = {**A, "sasl.username": "other"}


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


def test_a_consumer_is_reused_by_the_next_reader_of_the_same_cluster_and_kind():
    clients = SharedClients()
    with clients.consumer(A, LEDGER) as first:
        pass
    with clients.consumer(A, LEDGER) as again:
        assert again is first
    with clients.consumer(A, SOURCE) as source, clients.consumer(A_OTHER_USER, LEDGER) as other:
        assert source is not first and other is not first      # another kind, other credentials: their own
    assert clients.created == 3 and clients.held() == 3
    clients.close()
    assert clients.held() == 0


def test_concurrent_readers_never_share_a_consumer():
    clients = SharedClients()
    with clients.consumer(A, LEDGER) as one, clients.consumer(A, LEDGER) as two:
        assert one is not two
    assert clients.held() == 2
    clients.close()


def test_a_reader_that_failed_does_not_give_its_consumer_back():
    clients = SharedClients()
    with pytest.raises(RuntimeError):
        with clients.consumer(A, LEDGER):
            raise RuntimeError("broken")
    assert clients.held() == 0
    with clients.consumer(A, LEDGER):
        pass
    assert clients.created == 2
    clients.close()


def test_idle_clients_are_closed():
    clock = Clock()
    clients = SharedClients(idle_seconds=300, clock=clock)
    with clients.consumer(A, LEDGER):
        pass
    with clients.admin(A) as admin:
        assert admin is not None
    assert clients.held() == 2
    clock.t = 301
    clients.reap()
    assert clients.held() == 0
