"""Background sends are settled in sweeps: every answer is counted once, per topic, acknowledged or
failed; a quiet publisher still hears within the interval; draining waits for every answer."""

from __future__ import annotations

import asyncio

from services.runtime.acks import Unacked


def _rig(**kwargs: float) -> tuple[Unacked, list[tuple[str, int, int, BaseException | None]]]:
    settled: list[tuple[str, int, int, BaseException | None]] = []
    return Unacked(lambda *args: settled.append(args), **kwargs), settled  # type: ignore[arg-type]


async def test_a_sweep_counts_answered_sends_per_topic_and_keeps_the_rest() -> None:
    unacked, settled = _rig(sweep_at=100)
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in range(5)]
    for i, future in enumerate(futures):
        unacked.add("a" if i < 3 else "b", 2 if i == 0 else 1, future)
    futures[0].set_result(None)
    futures[1].set_exception(OSError("broker gone"))
    futures[3].set_result(None)
    unacked.sweep()
    assert sorted(settled, key=lambda s: s[0]) == [
        ("a", 2, 1, futures[1].exception()),
        ("b", 1, 0, None),
    ]
    assert len(unacked) == 2
    settled.clear()
    futures[2].cancel()
    futures[4].set_result(None)
    unacked.sweep()
    assert [(t, ok, bad) for t, ok, bad, _ in sorted(settled)] == [("a", 0, 1), ("b", 1, 0)]
    assert isinstance(dict((t, e) for t, _, _, e in settled)["a"], asyncio.CancelledError)
    assert len(unacked) == 0


async def test_a_busy_publisher_sweeps_as_the_list_grows_not_on_every_send() -> None:
    unacked, settled = _rig(sweep_at=4)
    loop = asyncio.get_running_loop()
    done = [loop.create_future() for _ in range(8)]
    for future in done:
        future.set_result(None)
    for future in done[:3]:
        unacked.add("t", 1, future)
    assert settled == []  # under the threshold
    unacked.add("t", 1, done[3])
    assert settled == [("t", 4, 0, None)] and len(unacked) == 0
    # Slow answers: after a sweep that keeps n waiting, the next comes once 2n are listed.
    waiting = [loop.create_future() for _ in range(6)]
    for future in waiting:
        unacked.add("t", 1, future)
    assert len(unacked) == 6  # swept at 4 (none answered, 4 kept), next at 8
    for future in waiting:
        future.set_result(None)
    unacked.add("t", 1, done[4])
    unacked.add("t", 1, done[5])
    assert len(unacked) == 0 and sum(s[1] for s in settled) == 4 + 8


async def test_a_quiet_publisher_hears_within_the_interval() -> None:
    unacked, settled = _rig(sweep_at=1000, interval_s=0.01)
    future = asyncio.get_running_loop().create_future()
    unacked.add("t", 3, future)
    asyncio.get_running_loop().call_later(0.02, future.set_exception, TimeoutError("no answer"))
    async with asyncio.timeout(5):
        while not settled:
            await asyncio.sleep(0.005)
    assert settled[0][:3] == ("t", 0, 3) and isinstance(settled[0][3], TimeoutError)
    assert len(unacked) == 0


async def test_drain_waits_for_every_answer() -> None:
    unacked, settled = _rig(sweep_at=1000, interval_s=60)
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in range(3)]
    for future in futures:
        unacked.add("t", 1, future)
    for i, future in enumerate(futures):
        loop.call_later(0.01 * (i + 1), future.set_result, None)
    await unacked.drain()
    assert settled == [("t", 3, 0, None)] and len(unacked) == 0
    await unacked.drain()  # nothing left: no second report
    assert len(settled) == 1
