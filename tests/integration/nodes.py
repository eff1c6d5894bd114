"""Helpers for tests that run tier nodes in-process: wait for a condition, run a node."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from services.tiers.service import TiersService
from services.tiers.settings import TiersSettings


async def until(condition: Callable[[], bool], timeout_s: float = 10.0, step_s: float = 0.001) -> float:
    """Seconds until `condition()` held; fails the test after `timeout_s`."""
    started = time.perf_counter()
    while not condition():
        if time.perf_counter() - started > timeout_s:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(step_s)
    return time.perf_counter() - started


@contextlib.asynccontextmanager
async def running(settings: TiersSettings) -> AsyncIterator[TiersService]:
    service = TiersService(settings)
    await service.start()
    task = asyncio.create_task(service.run())
    try:
        await until(
            lambda: all(c.health()["assigned"] for c in service._consumers), timeout_s=60, step_s=0.05
        )
        yield service
    finally:
        service.request_stop()
        await asyncio.gather(task, return_exceptions=True)
        await service.stop()
