"""Leader election's rules on a fake Lease API (the real API server: tests/e2e/test_upgrade_safety_e2e.py)."""
import copy
import threading

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from eos_operator.leader import LeaderElector, LeaseSettings


class FakeLeases:
    """read/create/replace of one Lease with resourceVersion checks, like the API server."""

    def __init__(self):
        self.lease: client.V1Lease | None = None
        self.version = 0
        self.fail = False

    def read_namespaced_lease(self, name, namespace):
        if self.fail:
            raise ApiException(status=503)
        if self.lease is None:
            raise ApiException(status=404)
        return copy.deepcopy(self.lease)

    def create_namespaced_lease(self, namespace, body):
        if self.lease is not None:
            raise ApiException(status=409)
        self.version += 1
        body.metadata.resource_version = str(self.version)
        self.lease = copy.deepcopy(body)
        return body

    def replace_namespaced_lease(self, name, namespace, body):
        if self.fail:
            raise ApiException(status=503)
        if body.metadata.resource_version != self.lease.metadata.resource_version:
            raise ApiException(status=409)
        self.version += 1
        body.metadata.resource_version = str(self.version)
        self.lease = copy.deepcopy(body)
        return body


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


S = dict(namespace="ops", duration=10.0, renew_deadline=7.0, retry=1.0)


def elector(api, who, clock):
    return LeaderElector(api, LeaseSettings(identity=who, **S), monotonic=clock)


def test_the_first_replica_creates_the_lease_and_the_second_stands_by_while_it_is_renewed():
    api, clock = FakeLeases(), Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a.try_acquire_or_renew() and api.lease.spec.holder_identity == "a"
    assert not b.try_acquire_or_renew()
    for _ in range(30):            # a renews every second: b never sees the record stand still for 10 s
        clock.t += 1
        assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    assert api.lease.spec.holder_identity == "a" and api.lease.spec.lease_transitions == 0


def test_a_standby_takes_over_only_after_the_record_stood_still_for_the_duration():
    api, clock = FakeLeases(), Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()      # b starts watching now
    clock.t += 9.5                            # a died: no renewal since
    assert not b.try_acquire_or_renew()
    clock.t += 1.0
    assert b.try_acquire_or_renew()
    assert api.lease.spec.holder_identity == "b" and api.lease.spec.lease_transitions == 1
    assert not a.try_acquire_or_renew()       # the old leader, back, does not take it back


def test_a_restarted_leader_waits_like_a_standby_and_the_standby_takes_over_first():
    """The leader's container killed and restarted by its kubelet: the new process has the same identity (the
    Pod's name) but did not acquire the Lease; it waits for the record to stand still like any standby, and the
    replica that stood by (watching since before the kill) takes over first (issue 28's real-node test)."""
    api, clock = FakeLeases(), Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    clock.t += 3                                   # a SIGKILLed; the kubelet starts its container again
    restarted = elector(api, "a", clock)
    assert not restarted.try_acquire_or_renew(), "a new process took its predecessor's Lease as its own"
    assert api.lease.spec.holder_identity == "a" and api.lease.spec.lease_transitions == 0
    clock.t += 7.5                                 # 10.5 s since b first saw the record, 7.5 s for the restarted
    assert b.try_acquire_or_renew() and not restarted.try_acquire_or_renew()
    assert api.lease.spec.holder_identity == "b" and api.lease.spec.lease_transitions == 1


def test_a_restarted_replica_alone_takes_its_own_stale_lease_after_the_duration():
    api, clock = FakeLeases(), Clock()
    assert elector(api, "a", clock).try_acquire_or_renew()
    restarted = elector(api, "a", clock)
    clock.t += 1
    assert not restarted.try_acquire_or_renew()
    clock.t += 10
    assert restarted.try_acquire_or_renew()
    assert api.lease.spec.holder_identity == "a" and api.lease.spec.lease_transitions == 1
    clock.t += 1
    assert restarted.try_acquire_or_renew() and api.lease.spec.lease_transitions == 1   # now its own: renewed


def test_two_standbys_racing_for_an_expired_lease_one_wins():
    api, clock = FakeLeases(), Clock()
    a, b, c = (elector(api, n, clock) for n in "abc")
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew() and not c.try_acquire_or_renew()
    clock.t += 11
    stale = api.read_namespaced_lease("spark-eos-operator", "ops")
    assert b.try_acquire_or_renew()
    # c read the lease before b replaced it: its replace carries the old resourceVersion and loses.
    c.observed, c.observed_at = None, 0
    api_read = api.read_namespaced_lease
    api.read_namespaced_lease = lambda *a: stale
    try:
        assert not c.try_acquire_or_renew()
    finally:
        api.read_namespaced_lease = api_read
    assert api.lease.spec.holder_identity == "b"


def test_release_hands_over_at_once():
    api, clock = FakeLeases(), Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    a.release()
    assert api.lease.spec.holder_identity is None
    assert b.try_acquire_or_renew()           # no waiting for the duration


def test_a_leader_that_cannot_renew_within_the_deadline_gives_up():
    api = FakeLeases()
    fast = LeaderElector(api, LeaseSettings(identity="a", namespace="ops", duration=0.5, renew_deadline=0.3,
                                            retry=0.05))
    assert fast.try_acquire_or_renew()
    api.fail = True
    lost = threading.Event()
    reasons = []
    fast.hold(lambda why: (reasons.append(why), lost.set()))
    assert lost.wait(5), "the leader kept acting without its Lease"
    assert "failed" in reasons[0]


def test_settings_must_leave_the_leader_time_to_stop_before_a_takeover():
    with pytest.raises(ValueError, match="renew deadline"):
        LeaseSettings(namespace="ops", duration=5, renew_deadline=6)
