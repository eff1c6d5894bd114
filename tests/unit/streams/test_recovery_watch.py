"""The recovery watchdog's verdicts over snapshots of (recovering, records left)."""

from __future__ import annotations

import pytest

from streams.recovery_watch import RecoveryWatch


def feed(watch: RecoveryWatch, snapshots: list[tuple[float, bool, int]]) -> list[str]:
    return [watch.observe(t, recovering, remaining) for t, recovering, remaining in snapshots]


def test_a_recovery_that_reads_is_never_restarted_however_long_it_takes() -> None:
    watch = RecoveryWatch(stall_after_s=5)
    left = [(float(t), True, 1_000 - 10 * t) for t in range(60)]  # 10 records a second, for a minute
    assert set(feed(watch, left)) == {"ok"} and watch.restarts == 0


def test_no_recovery_or_nothing_left_is_fine_for_ever() -> None:
    watch = RecoveryWatch(stall_after_s=5)
    assert set(feed(watch, [(float(t), False, 28) for t in range(100)])) == {"ok"}
    assert set(feed(watch, [(float(t), True, 0) for t in range(100, 200)])) == {"ok"}
    assert watch.restarts == 0


def test_a_stalled_recovery_is_restarted_after_doubling_stall_periods_then_given_up() -> None:
    watch = RecoveryWatch(stall_after_s=5, give_up_after=2)
    verdicts = feed(watch, [(float(t), True, 28) for t in range(0, 40)])  # the CI stall: 28 left, stuck
    assert [t for t, v in enumerate(verdicts) if v != "ok"] == [5, 15, 35]  # after 5, 10, 20 s
    assert [v for v in verdicts if v != "ok"] == ["restart", "restart", "give_up"]
    assert watch.restarts == 2


def test_restarts_that_read_nothing_cannot_keep_a_slow_recovery_from_finishing() -> None:
    """A recovery that reads only 3 s after a restart's re-seek (a loaded machine), watched with a stall
    period of 20 ms: at a fixed period every restart would come before the first read, for ever (CI saw
    that). With the doubling, a few restarts in, the watchdog waits long enough and the recovery runs."""
    watch = RecoveryWatch(stall_after_s=0.02, give_up_after=1_000_000)
    remaining, last_restart, t = 1_000, 0.0, 0.0
    while remaining > 0 and t < 600:
        t += 0.01
        if t - last_restart >= 3.0:  # reading: 10 records a tick
            remaining = max(0, remaining - 10)
        if watch.observe(t, True, remaining) == "restart":
            last_restart = t  # the restart re-seeks: the 3 s start again
    assert remaining == 0, f"{remaining} records left after {t:.0f} s and {watch.restarts} restarts"
    assert watch.restarts >= 1


def test_progress_after_a_restart_starts_the_count_again() -> None:
    watch = RecoveryWatch(stall_after_s=5, give_up_after=1)
    assert feed(watch, [(0.0, True, 28), (5.0, True, 28)]) == ["ok", "restart"]
    assert watch.observe(6.0, True, 20) == "ok"  # the restart helped: it reads again
    assert feed(watch, [(11.0, True, 20), (20.0, True, 20), (21.0, True, 20)]) == ["restart", "ok", "give_up"]


def test_more_to_read_is_not_progress_for_the_give_up_count() -> None:
    """Records appended to a changelog while it is recovered raise the remaining count; the stall
    clock starts again, but restarts that read nothing still add up."""
    watch = RecoveryWatch(stall_after_s=5, give_up_after=1)
    assert feed(watch, [(0.0, True, 28), (5.0, True, 28)]) == ["ok", "restart"]
    assert feed(watch, [(6.0, True, 30), (11.0, True, 30), (16.0, True, 30)]) == ["ok", "ok", "give_up"]


def test_a_finished_recovery_forgets_its_restarts_in_a_row() -> None:
    watch = RecoveryWatch(stall_after_s=5, give_up_after=1)
    assert feed(watch, [(0.0, True, 28), (5.0, True, 28), (6.0, False, 0)]) == ["ok", "restart", "ok"]
    assert feed(watch, [(10.0, True, 9), (15.0, True, 9)]) == ["ok", "restart"]
    assert watch.restarts == 2


@pytest.mark.parametrize("give_up_after", [0, 3])
def test_give_up_after_zero_exits_at_the_first_stall(give_up_after: int) -> None:
    watch = RecoveryWatch(stall_after_s=1, give_up_after=give_up_after)
    verdicts = feed(watch, [(float(t), True, 5) for t in range(0, 2 ** (give_up_after + 1))])
    assert verdicts[-1] == "give_up" and watch.restarts == give_up_after
