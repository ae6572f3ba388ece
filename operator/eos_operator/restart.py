"""Restart strategies: what to do when the driver failed. Pure functions.

The operator keeps the strategy's memory in the stream's status (restart count,
recent failure times, the last base delay, how long the failed driver ran) and
asks :func:`decide` once per failure. Exhausted means the stream is ``Failed``
with its checkpoint and ledger intact: stuck, never "skip the data".

Jitter is an input (``jitter_unit`` in [-1, 1]) rather than a random draw so a
re-planned failure (an operator restarted before its status write landed) gets
the same delay; the planner derives it from the stream uid and attempt number.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from eos_job.spec import ExponentialDelay, FailureRate, FixedDelay, RestartStrategy


@dataclass(frozen=True)
class RestartMemory:
    """What the strategy remembers between failures (persisted in status)."""
    restarts: int = 0                          # restarts since the last reset
    failure_times: tuple[float, ...] = ()      # epoch seconds of earlier failures (failure-rate)
    last_delay: float | None = None            # base delay of the last restart (exponential)


@dataclass(frozen=True)
class RestartDecision:
    restart: bool
    delay_seconds: float
    memory: RestartMemory = field(default_factory=RestartMemory)
    explanation: str = ""


def jitter_unit_for(seed: str) -> float:
    """A deterministic value in [-1, 1] for ``seed`` (e.g. ``"<uid>/<attempt>"``)."""
    digest = hashlib.sha256(seed.encode()).digest()
    return int.from_bytes(digest[:8], "big") / float(2**64 - 1) * 2.0 - 1.0


def decide(strategy: RestartStrategy, memory: RestartMemory, *, now: float,
           ran_for_seconds: float | None = None, jitter_unit: float = 0.0) -> RestartDecision:
    """Decide on one more failure at time ``now`` (epoch seconds).

    ``ran_for_seconds`` is how long the failed driver had been running (None if it
    never reached Running); the exponential strategy resets after a stable run.
    """
    if strategy.type == "fixed-delay":
        return _fixed_delay(strategy.fixed_delay or FixedDelay(), memory, now)
    if strategy.type == "exponential-delay":
        return _exponential(strategy.exponential_delay or ExponentialDelay(), memory, now,
                            ran_for_seconds, max(-1.0, min(1.0, jitter_unit)))
    if strategy.type == "failure-rate":
        return _failure_rate(strategy.failure_rate or FailureRate(), memory, now)
    raise ValueError(f"unknown restart strategy {strategy.type!r}")


def _fixed_delay(cfg: FixedDelay, memory: RestartMemory, now: float) -> RestartDecision:
    if memory.restarts >= cfg.attempts:
        return RestartDecision(False, 0.0, memory,
                               f"fixed-delay: all {cfg.attempts} restart attempts used")
    new = RestartMemory(restarts=memory.restarts + 1, failure_times=memory.failure_times,
                        last_delay=cfg.delay_seconds)
    return RestartDecision(True, cfg.delay_seconds, new,
                           f"fixed-delay: restart {new.restarts} of {cfg.attempts} in {cfg.delay_seconds:g}s")


def _exponential(cfg: ExponentialDelay, memory: RestartMemory, now: float, ran_for: float | None,
                 jitter_unit: float) -> RestartDecision:
    reset = ran_for is not None and ran_for >= cfg.reset_after_seconds
    if reset:
        memory = RestartMemory(failure_times=memory.failure_times)
    if cfg.max_attempts is not None and memory.restarts >= cfg.max_attempts:
        return RestartDecision(False, 0.0, memory,
                               f"exponential-delay: all {cfg.max_attempts} restart attempts used")
    ceiling = cfg.max_delay_seconds
    base = cfg.initial_delay_seconds if memory.last_delay is None else memory.last_delay * cfg.multiplier
    base = min(base, ceiling)
    delay = min(max(base * (1.0 + cfg.jitter * jitter_unit), 0.0), ceiling)
    new = RestartMemory(restarts=memory.restarts + 1, failure_times=memory.failure_times, last_delay=base)
    limit = f" of {cfg.max_attempts}" if cfg.max_attempts is not None else ""
    why = " (backoff reset after a stable run)" if reset else ""
    return RestartDecision(True, delay, new,
                           f"exponential-delay: restart {new.restarts}{limit} in {delay:.1f}s{why}")


def _failure_rate(cfg: FailureRate, memory: RestartMemory, now: float) -> RestartDecision:
    recent = tuple(t for t in memory.failure_times if now - t < cfg.interval_seconds) + (now,)
    # Keep no more than needed to judge the next failure.
    recent = recent[-(cfg.max_failures + 1):]
    if len(recent) > cfg.max_failures:
        return RestartDecision(False, 0.0, RestartMemory(memory.restarts, recent, memory.last_delay),
                               f"failure-rate: {len(recent)} failures within {cfg.interval_seconds:g}s "
                               f"(at most {cfg.max_failures} allowed)")
    new = RestartMemory(restarts=memory.restarts + 1, failure_times=recent, last_delay=cfg.delay_seconds)
    return RestartDecision(True, cfg.delay_seconds, new,
                           f"failure-rate: failure {len(recent)} of at most {cfg.max_failures} within "
                           f"{cfg.interval_seconds:g}s; restart in {cfg.delay_seconds:g}s")
