"""The vLLM KV-event bridge: subscribes to each configured vLLM engine's KV-event publisher (ZMQ PUB,
with its replay ROUTER for gaps) and produces `kv.events.v1`, one `EngineBridge` (forward.py) per engine,
positions in Postgres so a restart resumes where it stopped."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import zmq.asyncio

from services.bridge.forward import EngineBridge
from services.bridge.positions import PostgresPositionStore
from services.bridge.settings import BridgeSettings
from services.bridge.zmq_source import ZmqSource
from services.runtime.service import Loop, Service


class BridgeService(Service):
    name = "bridge"

    def __init__(self, settings: BridgeSettings) -> None:
        super().__init__(settings)
        self.bridge_settings = settings
        self.engines: list[EngineBridge] = []

    async def open(self, stack: AsyncExitStack) -> None:
        s = self.bridge_settings
        if not s.engines():
            raise ValueError("no vLLM publisher configured: set CACHEMESH_BRIDGE_ENDPOINT or _PUBLISHERS")
        store = PostgresPositionStore(await self.open_database(stack))
        publisher = await self.open_publisher(stack)
        ctx = zmq.asyncio.Context()
        stack.callback(ctx.term)
        for config in s.engines():
            source = ZmqSource(ctx, config, rcvhwm=s.rcvhwm, replay_timeout_ms=s.replay_timeout_ms)
            source.start()
            stack.callback(source.close)
            self.engines.append(
                EngineBridge(
                    config,
                    source,
                    publisher,
                    store,
                    namespace=s.kafka.topic_namespace,
                    max_tracked_blocks=s.max_tracked_blocks,
                    max_payload_bytes=s.max_payload_bytes,
                    replay_history=s.replay_history_on_first_start,
                )
            )
        stack.callback(self.engines.clear)

    def loops(self) -> list[Loop]:
        return [engine.run for engine in self.engines]

    async def checks(self) -> dict[str, Any]:
        return {"engines": [engine.health() for engine in self.engines]}
