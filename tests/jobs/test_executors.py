"""The cluster-mode driver's wait for its first executor, and the reason it gives when none comes."""
import pytest

from eos_job import executors
from eos_job.contract import JobFailed

pytestmark = pytest.mark.unit


class _Status:
    def __init__(self, n):
        self.n = n

    def size(self):
        return self.n


class _Spark:
    """Stands in for a SparkSession: the block manager list (driver + executors) over time."""

    def __init__(self, sizes):
        self.sizes = list(sizes)
        outer = self

        class Sc:
            def getExecutorMemoryStatus(self):
                return _Status(outer.sizes.pop(0) if len(outer.sizes) > 1 else outer.sizes[0])

        class Jsc:
            def sc(self):
                return Sc()

        class Context:
            _jsc = Jsc()

        self.sparkContext = Context()


def test_the_first_executor_ends_the_wait(monkeypatch):
    monkeypatch.setattr(executors.time, "sleep", lambda s: None)
    assert executors.wait_for_executors(_Spark([1, 1, 3]), 60) == 2


def test_forbidden_pod_creation_is_named(monkeypatch):
    clock = iter(range(0, 10_000, 5))
    monkeypatch.setattr(executors.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(executors.time, "sleep", lambda s: None)
    monkeypatch.setattr(executors, "may_create_pods", lambda: (False, "team-a/spark-eos-driver"))
    with pytest.raises(JobFailed, match=r"team-a/spark-eos-driver may not create pods \(RBAC forbids it\)"):
        executors.wait_for_executors(_Spark([1]), 20)


def test_allowed_but_no_executor_points_at_the_pods(monkeypatch):
    clock = iter(range(0, 10_000, 5))
    monkeypatch.setattr(executors.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(executors.time, "sleep", lambda s: None)
    monkeypatch.setattr(executors, "may_create_pods", lambda: (True, "team-a/spark-eos-driver"))
    with pytest.raises(JobFailed, match="spark-role=executor"):
        executors.wait_for_executors(_Spark([1]), 20)


def test_without_a_token_the_question_is_not_asked(tmp_path):
    allowed, why = executors.may_create_pods(tmp_path, {})
    assert allowed is None and "no ServiceAccount token" in why


def test_a_session_that_fails_to_start_is_explained(monkeypatch):
    monkeypatch.setattr(executors, "may_create_pods", lambda: (False, "team-a/spark-eos-driver"))
    err = executors.start_failure(RuntimeError("py4j error\n at ..."))
    assert "Spark could not start its executors: team-a/spark-eos-driver may not create pods" in str(err)
    monkeypatch.setattr(executors, "may_create_pods", lambda: (True, "team-a/spark-eos-driver"))
    assert str(executors.start_failure(RuntimeError("\nno route to host\n"))).endswith("could not start: no route to host")
