"""Status timestamps: the restart's not-before time keeps milliseconds, and both forms parse."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from eos_operator.timeutil import fmt, fmt_ceil, fmt_ms_ceil, parse

from .fakes import T0


@pytest.mark.parametrize("micros, text", [
    (0, "2026-01-01T12:00:00.000Z"),
    (250_000, "2026-01-01T12:00:00.250Z"),
    (250_001, "2026-01-01T12:00:00.251Z"),          # rounded up: never earlier than intended
    (999_001, "2026-01-01T12:00:01.000Z"),          # into the next second
])
def test_milliseconds_rounded_up(micros, text):
    assert fmt_ms_ceil(T0 + timedelta(microseconds=micros)) == text


def test_a_delay_of_a_fraction_of_a_second_is_not_rounded_to_the_next_second():
    now = T0 + timedelta(seconds=30.25)
    at = parse(fmt_ms_ceil(now + timedelta(seconds=0.3)))
    assert (at - now).total_seconds() == pytest.approx(0.3)
    assert parse(fmt_ceil(now + timedelta(seconds=0.3))) == T0 + timedelta(seconds=31)   # what it was


def test_naive_and_other_zones_are_written_in_utc():
    assert fmt_ms_ceil(datetime(2026, 1, 1, 12, 0, 0, 500_000)) == "2026-01-01T12:00:00.500Z"
    plus_one = timezone(timedelta(hours=1))
    assert fmt_ms_ceil(datetime(2026, 1, 1, 13, 0, 0, 500_000, tzinfo=plus_one)) == "2026-01-01T12:00:00.500Z"


@pytest.mark.parametrize("text, micros", [
    ("2026-01-01T12:00:40Z", 40_000_000),            # an older operator's whole seconds
    ("2026-01-01T12:00:40.250Z", 40_250_000),
    ("2026-01-01T12:00:40.250123Z", 40_250_123),
    ("2026-01-01T12:00:40.25+00:00", 40_250_000),
])
def test_whole_seconds_and_fractions_parse(text, micros):
    assert parse(text) == T0 + timedelta(microseconds=micros)


def test_round_trips():
    for dt in (T0, T0 + timedelta(microseconds=123_456), T0 + timedelta(days=400, microseconds=1)):
        back = parse(fmt_ms_ceil(dt))
        assert dt <= back < dt + timedelta(milliseconds=1)
        assert parse(fmt(dt)) <= dt
    assert parse(None) is None and parse("") is None
