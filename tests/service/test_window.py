"""Reboot windows and guards as pure functions."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

from hypothesis import given
from hypothesis import strategies as st

from service.window import DAYS, Guard, Window, reboot_due

moments = st.datetimes(
    min_value=datetime(2020, 1, 1), max_value=datetime(2035, 1, 1), timezones=st.just(UTC)
)
clock = st.times()


@given(moments)
def test_default_window_is_always_open(when: datetime) -> None:
    """Without days or times, every moment is inside the window."""
    assert Window().contains(when)


@given(moments, clock, clock, st.sets(st.sampled_from(DAYS), min_size=1))
def test_window_matches_kured_semantics(
    when: datetime, start: time, end: time, days: set[str]
) -> None:
    """Inside iff the time lies in [start, end] (wrapping at midnight) on a day the window
    started on."""
    w = Window(days=tuple(days), start=start, end=end)
    t = when.time()
    today = DAYS[(when.weekday() + 1) % 7]
    yesterday = DAYS[when.weekday()]  # weekday() is Monday=0: DAYS[weekday] is the day before
    if start <= end:
        expected = today in days and start <= t <= end
    else:
        expected = (t >= start and today in days) or (t <= end and yesterday in days)
    assert w.contains(when) is expected


def test_window_in_another_time_zone() -> None:
    """Times are read in the window's zone: 22:30 UTC is 23:30 in Berlin in winter."""
    w = Window(start=time(23, 0), end=time(23, 59), timezone="Europe/Berlin")
    assert w.contains(datetime(2026, 1, 5, 22, 30, tzinfo=UTC))
    assert not w.contains(datetime(2026, 1, 5, 23, 30, tzinfo=UTC))


@given(
    moments,
    st.integers(0, 10_000),
    st.integers(0, 10_000),
    st.integers(0, 5000),
    st.integers(0, 5000),
)
def test_guards_hold(
    now: datetime, since_drop: float, since_request: float, delay: float, interval: float
) -> None:
    """Never due within min_delay of a drop or min_interval of a request; due otherwise."""
    stamp = now.timestamp()
    due, why = reboot_due(
        now,
        waiting=True,
        last_drop=stamp - since_drop,
        last_request=stamp - since_request,
        window=Window(),
        guard=Guard(min_delay=delay, min_interval=interval),
    )
    assert due is (since_drop >= delay and since_request >= interval), why


@given(moments)
def test_nothing_waiting_never_reboots(now: datetime) -> None:
    """Without a waiting generation no reboot is ever due."""
    assert reboot_due(
        now, waiting=False, last_drop=None, last_request=None, window=Window(), guard=Guard(0, 0)
    ) == (False, "no generation waits for a reboot")


def test_outside_the_window_waits() -> None:
    """A due reboot outside the window is held back with that reason."""
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)  # a Sunday
    w = Window(days=("sat",), start=time(1), end=time(5))
    assert reboot_due(
        now, waiting=True, last_drop=None, last_request=None, window=w, guard=Guard()
    ) == (False, "outside the reboot window")
    assert reboot_due(
        now + timedelta(days=6, hours=-9),
        waiting=True,
        last_drop=None,
        last_request=None,
        window=w,
        guard=Guard(),
    )[0]
