"""Reboot windows and guards as pure functions."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

from hypothesis import given
from hypothesis import strategies as st

from service.rebooting.window import DAYS, Decision, Guard, Why, Window, reboot_due

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
    decision = reboot_due(
        now,
        waiting=True,
        last_drop=stamp - since_drop,
        last_request=stamp - since_request,
        window=Window(),
        guard=Guard(min_delay=delay, min_interval=interval),
    )
    assert decision.due is (since_drop >= delay and since_request >= interval), decision


@given(moments)
def test_nothing_waiting_never_reboots(now: datetime) -> None:
    """Without a waiting generation no reboot is ever due, and time alone changes nothing."""
    decision = reboot_due(
        now, waiting=False, last_drop=None, last_request=None, window=Window(), guard=Guard(0, 0)
    )
    assert decision == Decision(Why.NOTHING_WAITS)
    assert decision.text() == "no generation waits for a reboot"
    assert decision.recheck(30.0) is None


def test_outside_the_window_waits() -> None:
    """A due reboot outside the window is held back with that reason and when it opens."""
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)  # a Sunday
    w = Window(days=("sat",), start=time(1), end=time(5))
    held = reboot_due(now, waiting=True, last_drop=None, last_request=None, window=w, guard=Guard())
    opens = datetime(2026, 12, 5, 1, 0, tzinfo=UTC)
    assert held == Decision(Why.OUTSIDE_WINDOW, left=(opens - now).total_seconds(), opens=opens)
    assert held.text() == "outside the reboot window"
    assert held.recheck(30.0) == 30.0
    assert reboot_due(
        now + timedelta(days=6, hours=-9),
        waiting=True,
        last_drop=None,
        last_request=None,
        window=w,
        guard=Guard(),
    ).due


def test_each_decision_reads_as_status_shows_it() -> None:
    """The English text comes from the typed decision, word for word what status showed."""
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    stamp = now.timestamp()

    def decide(**kw: float | None) -> Decision:
        args: dict[str, float | None] = {"last_drop": None, "last_request": None}
        return reboot_due(now, waiting=True, window=Window(), guard=Guard(60, 3600), **(args | kw))

    after_drop = decide(last_drop=stamp - 20)
    assert (after_drop.why, after_drop.left) == (Why.AFTER_DROP, 40.0)
    assert after_drop.text() == "waiting 40 s after the last drop"
    too_soon = decide(last_request=stamp - 600)
    assert (too_soon.why, too_soon.left, too_soon.since) == (Why.TOO_SOON, 3000.0, 600.0)
    assert too_soon.text() == "a reboot was asked for 600 s ago (3000 s left)"
    assert decide().text() == "due" and decide().due and decide().recheck(30.0) is None


@given(moments, st.integers(0, 5000), st.integers(1, 5000), st.sampled_from(["drop", "request"]))
def test_a_recheck_comes_no_later_than_the_guard_runs_out(
    now: datetime, since: int, length: int, which: str
) -> None:
    """Re-checked at most ``every`` seconds later, and exactly when a guard runs out sooner:
    at that moment the guard no longer holds the reboot back."""
    stamp = now.timestamp()
    guard = Guard(min_delay=length, min_interval=0) if which == "drop" else Guard(0, length)
    times = {"last_drop": stamp - since, "last_request": None}
    if which == "request":
        times = {"last_drop": None, "last_request": stamp - since}
    decision = reboot_due(now, waiting=True, window=Window(), guard=guard, **times)
    if since >= length:
        assert decision.due
        return
    after = decision.recheck(30.0)
    assert after is not None and after <= 30.0
    if decision.left is not None and decision.left <= 30.0:
        later = now + timedelta(seconds=after + 1e-3)
        assert reboot_due(later, waiting=True, window=Window(), guard=guard, **times).due


windows = st.builds(
    Window, days=st.sets(st.sampled_from(DAYS), min_size=1).map(tuple), start=clock, end=clock
)


@given(moments, windows)
def test_next_open_is_a_moment_inside_the_window(now: datetime, window: Window) -> None:
    """``next_open`` is now when open, else a later moment inside the window."""
    opens = window.next_open(now)
    assert opens is not None  # some day of the week is allowed: it opens within 8 days
    assert window.contains(opens) and opens >= now
    assert (opens == now) is window.contains(now)
