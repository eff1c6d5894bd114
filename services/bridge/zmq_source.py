"""The ZMQ edge of the bridge: a SUB socket on a vLLM publisher's PUB endpoint, and replay requests to
its ROUTER endpoint (one DEALER per request, so a late reply to a request given up on can never be
mistaken for the answer to the next). Frames are interpreted by wire.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import zmq
import zmq.asyncio

from services.bridge.settings import PublisherConfig
from services.bridge.wire import END_OF_REPLAY, WireError, seq_of


class ReplayUnavailable(RuntimeError):
    """The replay socket did not answer in time, or answered something that is not a replay."""


class ZmqSource:
    def __init__(
        self, ctx: zmq.asyncio.Context, config: PublisherConfig, *, rcvhwm: int, replay_timeout_ms: int
    ) -> None:
        self.config = config
        self._ctx = ctx
        self._rcvhwm = rcvhwm
        self._timeout_ms = replay_timeout_ms
        self._sub: zmq.asyncio.Socket | None = None

    def start(self) -> None:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, self._rcvhwm)
        sub.setsockopt(zmq.SUBSCRIBE, self.config.topic.encode())
        sub.connect(self.config.endpoint)
        self._sub = sub

    def close(self) -> None:
        if self._sub is not None:
            self._sub.close(linger=0)
            self._sub = None

    async def receive(self) -> list[bytes]:
        assert self._sub is not None, "source not started"
        return list(await self._sub.recv_multipart())

    async def replay(self, start_seq: int) -> AsyncIterator[tuple[int, bytes]]:
        """Every buffered (seq, payload) from `start_seq` on, as vLLM's `_service_replay` sends them:
        the ROUTER gets [identity, "", start] and answers [identity, "", topic, seq, payload] per batch,
        then [identity, "", "", -1, ""] (releases before 0.32 left the topic out)."""
        if self.config.replay_endpoint is None:
            raise ReplayUnavailable("no replay endpoint configured")
        dealer = self._ctx.socket(zmq.DEALER)
        try:
            dealer.connect(self.config.replay_endpoint)
            await dealer.send_multipart([b"", max(start_seq, 0).to_bytes(8, "big")])
            while True:
                if not await dealer.poll(self._timeout_ms):
                    raise ReplayUnavailable(f"no reply within {self._timeout_ms} ms")
                frames = await dealer.recv_multipart()
                if len(frames) not in (3, 4) or frames[0] != b"":
                    raise ReplayUnavailable(
                        f"a replay reply has {len(frames)} frames, not ['', topic, seq, payload]"
                    )
                try:
                    seq = seq_of(frames[-2])
                except WireError as exc:
                    raise ReplayUnavailable(exc.reason) from None
                if seq == END_OF_REPLAY:
                    return
                yield seq, frames[-1]
        finally:
            dealer.close(linger=0)
