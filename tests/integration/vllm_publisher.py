"""A small re-implementation of vLLM's `ZmqEventPublisher` (vllm/distributed/kv_events.py) for the
bridge's tests: a PUB socket sending [topic, seq (8-byte big-endian), payload], an in-memory replay
buffer, and a ROUTER socket that answers [identity, "", start_seq] with [identity, "", seq, payload] for
every buffered batch from start_seq on and then [identity, "", -1, ""]. One thread owns both sockets, as
in vLLM. Tests can also drop a batch from the PUB side while keeping it for replay (a gap), or send
arbitrary frames (bad messages)."""

from __future__ import annotations

import itertools
import queue
import threading
from collections import deque
from typing import Self

import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class VllmPublisher:
    def __init__(self, topic: str = "kv-events", buffer_steps: int = 10_000, replay: bool = True) -> None:
        self.topic = topic.encode()
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        port = self._pub.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self._replay: zmq.Socket[bytes] | None = None
        self.replay_endpoint: str | None = None
        if replay:
            self._replay = self._ctx.socket(zmq.ROUTER)
            rport = self._replay.bind_to_random_port("tcp://127.0.0.1")
            self.replay_endpoint = f"tcp://127.0.0.1:{rport}"
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = itertools.count()
        self._queue: queue.Queue[tuple[str, object] | None] = queue.Queue()
        self.replay_requests: list[int] = []
        self.published = 0
        self._thread = threading.Thread(target=self._loop, daemon=True, name="vllm-publisher")

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._queue.put(None)
        self._thread.join(5)
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._ctx.term()

    def publish(self, payload: bytes, *, drop_on_pub: bool = False) -> None:
        """One batch: the next sequence number, sent on PUB (unless dropped) and kept for replay."""
        self._queue.put(("batch", (payload, drop_on_pub)))

    def send_frames(self, frames: list[bytes]) -> None:
        """Frames sent on PUB as they are, outside the numbering (malformed messages)."""
        self._queue.put(("raw", frames))

    def restart_numbering(self) -> None:
        """What an engine restart looks like on the wire: numbering from 0 again, an empty buffer."""
        self._queue.put(("restart", None))

    def flush(self) -> None:
        self._queue.join()

    def _loop(self) -> None:
        while True:
            if self._replay is not None and self._replay.poll(0):
                self._service_replay()
            try:
                item = self._queue.get(timeout=0.005)
            except queue.Empty:
                continue
            if item is None:
                self._queue.task_done()
                return
            kind, arg = item
            if kind == "batch":
                payload, drop = arg  # type: ignore[misc]
                seq = next(self._seq)
                if not drop:
                    self._pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
                self._buffer.append((seq, payload))
                self.published += 1
            elif kind == "raw":
                self._pub.send_multipart(arg)  # type: ignore[arg-type]
            elif kind == "restart":
                self._seq = itertools.count()
                self._buffer.clear()
            self._queue.task_done()

    def _service_replay(self) -> None:
        assert self._replay is not None
        frame = self._replay.recv_multipart()
        if len(frame) != 3:
            return  # vLLM logs "Invalid replay request" and ignores it
        client_id, _, start_seq_bytes = frame
        start_seq = int.from_bytes(start_seq_bytes, "big")
        self.replay_requests.append(start_seq)
        for seq, buf in self._buffer:
            if seq >= start_seq:
                self._replay.send_multipart((client_id, b"", seq.to_bytes(8, "big"), buf))
        self._replay.send_multipart((client_id, b"", END_SEQ, b""))
