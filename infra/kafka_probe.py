"""A tiny blocking Kafka client that asks a broker "who is in the cluster?" to tell when it is ready.

Raw sockets rather than aiokafka: it must work from any thread, including inside a running event loop's
to_thread, and it costs one round trip. Wire format: https://kafka.apache.org/protocol (ApiVersions v0,
Metadata v1-v8, the non-flexible versions every broker from 0.11 to 4.x and tansu accept).
"""

from __future__ import annotations

import socket
import struct

_API_METADATA = 3
_API_VERSIONS = 18
_CLIENT_ID = b"cachemesh-probe"
# Metadata versions whose request/response layout _metadata_request/_broker_count understand.
_METADATA_MIN, _METADATA_MAX = 1, 8


class ProbeError(OSError):
    """The broker answered, but not with a usable cluster (error code, no brokers, bad frame)."""


def split_bootstrap(bootstrap: str) -> tuple[str, int]:
    """'host:port' (first entry of a comma list) -> (host, port)."""
    first = bootstrap.split(",")[0].strip()
    host, _, port = first.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"bootstrap must look like host:port, got {bootstrap!r}")
    return host.strip("[]"), int(port)


def broker_count(bootstrap: str, timeout_s: float = 2.0) -> int:
    """Brokers the cluster reports in a Metadata response; raises OSError (ProbeError) when not ready."""
    host, port = split_bootstrap(bootstrap)
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        versions = _api_versions(sock)
        low, high = versions.get(_API_METADATA, (0, -1))
        version = min(high, _METADATA_MAX)
        if version < max(low, _METADATA_MIN):
            raise ProbeError(f"broker offers Metadata v{low}-v{high}; the probe speaks v1-v8")
        body = _roundtrip(sock, _API_METADATA, version, 2, _metadata_request(version))
        count = _broker_count(body, version)
    if count < 1:
        raise ProbeError("broker reports no brokers in its cluster yet")
    return count


def _roundtrip(sock: socket.socket, api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    header = struct.pack(">hhih", api_key, version, correlation_id, len(_CLIENT_ID)) + _CLIENT_ID
    payload = header + body
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    (size,) = struct.unpack(">i", _read_exactly(sock, 4))
    frame = _read_exactly(sock, size)
    (got_id,) = struct.unpack_from(">i", frame)
    if got_id != correlation_id:
        raise ProbeError(f"correlation id {got_id} != {correlation_id}")
    return frame[4:]


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ProbeError("broker closed the connection")
        chunks += chunk
    return bytes(chunks)


def _api_versions(sock: socket.socket) -> dict[int, tuple[int, int]]:
    # v0 is what every broker answers, even one that wants newer clients (it replies in v0 then).
    body = _roundtrip(sock, _API_VERSIONS, 0, 1, b"")
    error, count = struct.unpack_from(">hi", body)
    if error != 0:
        raise ProbeError(f"ApiVersions error code {error}")
    keys = struct.iter_unpack(">hhh", body[6 : 6 + 6 * count])
    return {key: (low, high) for key, low, high in keys}


def _metadata_request(version: int) -> bytes:
    request = struct.pack(">i", 0)  # no topics: only the broker list is wanted
    if version >= 4:
        request += struct.pack(">?", False)  # allow_auto_topic_creation
    if version >= 8:
        request += struct.pack(">??", False, False)  # include cluster/topic authorized operations
    return request


def _broker_count(body: bytes, version: int) -> int:
    offset = 4 if version >= 3 else 0  # throttle_time_ms
    (count,) = struct.unpack_from(">i", body, offset)
    return max(count, 0)
