"""Restart strategies: pure functions, checked with hypothesis."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from eos_job.spec import ExponentialDelay, FailureRate, FixedDelay, RestartStrategy
from eos_operator.restart import RestartMemory, decide, jitter_unit_for

fixed_cfgs = st.builds(FixedDelay, attempts=st.integers(0, 20),
                       delay_seconds=st.floats(0, 3600, allow_nan=False))
expo_cfgs = st.builds(
    ExponentialDelay,
    initial_delay_seconds=st.floats(0, 100, allow_nan=False),
    max_delay_seconds=st.floats(100, 3600, allow_nan=False),   # at least initialDelaySeconds (the spec refuses less)
    multiplier=st.floats(1.0, 10.0, allow_nan=False),
    jitter=st.floats(0.0, 1.0, allow_nan=False),
    reset_after_seconds=st.floats(1, 3600, allow_nan=False),
    max_attempts=st.one_of(st.none(), st.integers(0, 20)),
)
rate_cfgs = st.builds(FailureRate, max_failures=st.integers(1, 10),
                      interval_seconds=st.floats(1, 3600, allow_nan=False),
                      delay_seconds=st.floats(0, 600, allow_nan=False))
gaps = st.lists(st.floats(0, 5000, allow_nan=False), min_size=1, max_size=40)
units = st.floats(-1.0, 1.0, allow_nan=False)


def run_failures(strategy: RestartStrategy, gaps_between: list[float], ran_for: float | None = None,
                 jitter: float = 0.0):
    """Feed failures at the given spacing; stop at the first exhaustion."""
    mem, now, decisions = RestartMemory(), 0.0, []
    for gap in gaps_between:
        now += gap
        d = decide(strategy, mem, now=now, ran_for_seconds=ran_for, jitter_unit=jitter)
        decisions.append(d)
        if not d.restart:
            break
        mem = d.memory
    return decisions


@given(fixed_cfgs, gaps)
def test_fixed_delay_allows_exactly_attempts_restarts(cfg, spacing):
    ds = run_failures(RestartStrategy(type="fixed-delay", fixed_delay=cfg), spacing)
    restarts = [d for d in ds if d.restart]
    assert len(restarts) == min(cfg.attempts, len(spacing))
    assert all(d.delay_seconds == cfg.delay_seconds for d in restarts)
    if len(spacing) > cfg.attempts:
        assert not ds[-1].restart and "attempts" in ds[-1].explanation


@given(expo_cfgs, gaps, units)
def test_exponential_delay_stays_within_bounds_and_grows(cfg, spacing, jitter):
    ds = run_failures(RestartStrategy(type="exponential-delay", exponential_delay=cfg), spacing, jitter=jitter)
    restarts = [d for d in ds if d.restart]
    bases = [d.memory.last_delay for d in restarts]
    for d in restarts:
        assert 0.0 <= d.delay_seconds <= cfg.max_delay_seconds + 1e-9
        base = d.memory.last_delay
        assert abs(d.delay_seconds - base) <= base * cfg.jitter + 1e-9 or d.delay_seconds == cfg.max_delay_seconds
    assert bases == sorted(bases)                               # never shrinks without a stable run
    if bases:
        assert bases[0] == min(cfg.initial_delay_seconds, cfg.max_delay_seconds)
    if cfg.max_attempts is not None:
        assert len(restarts) <= cfg.max_attempts
        if len(spacing) > cfg.max_attempts:
            assert not ds[-1].restart
    else:
        assert all(d.restart for d in ds)                       # unlimited


@given(expo_cfgs, st.integers(1, 10))
def test_exponential_delay_resets_after_a_stable_run(cfg, failures):
    strategy = RestartStrategy(type="exponential-delay",
                               exponential_delay=cfg.model_copy(update={"max_attempts": None}))
    mem = RestartMemory()
    for _ in range(failures):
        mem = decide(strategy, mem, now=0, ran_for_seconds=0).memory
    after_stable = decide(strategy, mem, now=0, ran_for_seconds=cfg.reset_after_seconds)
    assert after_stable.restart
    assert after_stable.memory.restarts == 1
    assert after_stable.memory.last_delay == min(cfg.initial_delay_seconds, cfg.max_delay_seconds)


@given(rate_cfgs, gaps)
def test_failure_rate_fails_only_when_too_many_failures_in_the_interval(cfg, spacing):
    strategy = RestartStrategy(type="failure-rate", failure_rate=cfg)
    ds = run_failures(strategy, spacing)
    times, now = [], 0.0
    for gap, d in zip(spacing, ds):
        now += gap
        times.append(now)
        in_window = [t for t in times if now - t < cfg.interval_seconds]
        assert d.restart == (len(in_window) <= cfg.max_failures)
        if d.restart:
            assert d.delay_seconds == cfg.delay_seconds
        assert len(d.memory.failure_times) <= cfg.max_failures + 1


@given(rate_cfgs, st.integers(1, 50))
def test_failure_rate_never_fails_when_failures_are_spread_out(cfg, n):
    spacing = [cfg.interval_seconds + 1] * n
    assert all(d.restart for d in run_failures(RestartStrategy(type="failure-rate", failure_rate=cfg), spacing))


@settings(max_examples=50)
@given(st.sampled_from(["fixed-delay", "exponential-delay", "failure-rate"]), gaps, units)
def test_decisions_are_deterministic(kind, spacing, jitter):
    strategy = RestartStrategy(type=kind)
    a = run_failures(strategy, spacing, jitter=jitter)
    b = run_failures(strategy, spacing, jitter=jitter)
    assert a == b


@given(st.text(max_size=50))
def test_jitter_unit_is_in_range_and_stable(seed):
    u = jitter_unit_for(seed)
    assert -1.0 <= u <= 1.0
    assert u == jitter_unit_for(seed)


def test_exponential_example():
    strategy = RestartStrategy(type="exponential-delay", exponential_delay=ExponentialDelay(
        initial_delay_seconds=1, max_delay_seconds=10, multiplier=2, jitter=0, max_attempts=6))
    delays = [d.delay_seconds for d in run_failures(strategy, [1] * 8) if d.restart]
    assert delays == [1, 2, 4, 8, 10, 10]
