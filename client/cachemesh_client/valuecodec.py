"""LLM-aware value serialization (docs/design.md §1.1, L3), shared by the tier node and the clients
that write tensors (the vLLM connector): a fixed little-endian tensor header, then the raw payload at a
64-byte aligned offset so `decode` hands back a numpy view without copying.

Layout (all little-endian)::

    0   magic "CMV1" | version u8 | kind u8 | dtype u8 | ndim u8 | header_len u16 | model_len u16
    12  layer_start u32 | layer_end u32 | token_start u64 | token_end u64
    36  payload_len u64 | crc32(payload) u32
    48  shape: ndim x u64, then the model name (utf-8), zero padding to a multiple of 64
    header_len  payload (payload_len bytes, C order)

bfloat16 has no numpy dtype: it travels as its raw 16-bit patterns (uint16) tagged `BFLOAT16`;
`float32_to_bfloat16` / `bfloat16_to_float32` convert with round-to-nearest-even.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

EntryKind = Literal["prompt", "embedding", "kv_block"]  # schemas.events.EntryKind

MAGIC = b"CMV1"
VERSION = 1
PAYLOAD_ALIGN = 64
MAX_NDIM = 8
_FIXED = struct.Struct("<4sBBBBHHIIQQQI")
_SHAPE_DIM = struct.Struct("<Q")


class CodecError(ValueError):
    """The bytes are not a value this codec wrote, or they were damaged on the way."""


class DType(IntEnum):
    FLOAT32 = 1
    FLOAT16 = 2
    BFLOAT16 = 3  # carried as uint16 bit patterns
    INT8 = 4
    UINT8 = 5
    INT32 = 6
    INT64 = 7


# The numpy dtype each wire dtype is carried in (always little-endian on the wire).
CARRIER: dict[DType, np.dtype[Any]] = {
    DType.FLOAT32: np.dtype("<f4"),
    DType.FLOAT16: np.dtype("<f2"),
    DType.BFLOAT16: np.dtype("<u2"),
    DType.INT8: np.dtype("i1"),
    DType.UINT8: np.dtype("u1"),
    DType.INT32: np.dtype("<i4"),
    DType.INT64: np.dtype("<i8"),
}
_FROM_NUMPY: dict[str, DType] = {
    "float32": DType.FLOAT32,
    "float16": DType.FLOAT16,
    "bfloat16": DType.BFLOAT16,  # ml_dtypes / jax arrays, reinterpreted as uint16
    "int8": DType.INT8,
    "uint8": DType.UINT8,
    "int32": DType.INT32,
    "int64": DType.INT64,
}
_KIND_CODE: dict[str, int] = {"prompt": 1, "embedding": 2, "kv_block": 3}
_KIND_NAME: dict[int, EntryKind] = {1: "prompt", 2: "embedding", 3: "kv_block"}


@dataclass(frozen=True, slots=True)
class ValueHeader:
    kind: EntryKind
    dtype: DType
    shape: tuple[int, ...]
    model: str
    layer_range: tuple[int, int]  # [start, end) of the transformer layers a KV value covers
    token_range: tuple[int, int]  # [start, end) of the token positions it covers
    checksum: int  # crc32 of the payload
    payload_len: int
    header_len: int


def _wire_dtype(array: np.ndarray, dtype: DType | None) -> DType:
    if dtype is not None:
        carrier = CARRIER[dtype]
        if array.dtype.itemsize != carrier.itemsize or (
            dtype is not DType.BFLOAT16 and array.dtype.kind != carrier.kind
        ):
            raise CodecError(f"array of {array.dtype} cannot be carried as {dtype.name}")
        return dtype
    try:
        return _FROM_NUMPY[array.dtype.name]
    except KeyError:
        raise CodecError(
            f"unsupported dtype {array.dtype}; supported: {', '.join(sorted(_FROM_NUMPY))}"
        ) from None


def encode_parts(
    array: npt.ArrayLike,
    *,
    kind: EntryKind,
    model: str,
    layer_range: tuple[int, int] = (0, 0),
    token_range: tuple[int, int] = (0, 0),
    dtype: DType | None = None,
) -> tuple[bytes, memoryview]:
    """Header bytes and a view of the payload, for writers that scatter-gather (sockets, block pools).

    `dtype` overrides inference; pass `DType.BFLOAT16` with a uint16 array of bfloat16 bit patterns.
    """
    arr = np.asarray(array)
    wire = _wire_dtype(arr, dtype)
    # Reinterpret (not convert) into the carrier: bfloat16 bits stay bits; big-endian input is swapped.
    shape = arr.shape
    if arr.dtype.name == "bfloat16":
        arr = arr.view(np.uint16)
    # Same kind and width by now, so astype only fixes byte order; copy only when it must.
    arr = np.ascontiguousarray(arr.astype(CARRIER[wire], copy=False)).reshape(shape)
    if arr.ndim > MAX_NDIM:
        raise CodecError(f"at most {MAX_NDIM} dimensions, got {arr.ndim}")
    if kind not in _KIND_CODE:
        raise CodecError(f"unknown kind {kind!r}")
    model_b = model.encode()
    if len(model_b) > 0xFFFF:
        raise CodecError("model name longer than 65535 bytes")
    for name, (lo, hi) in (("layer_range", layer_range), ("token_range", token_range)):
        if not 0 <= lo <= hi:
            raise CodecError(f"{name} must satisfy 0 <= start <= end, got {(lo, hi)}")
    payload = arr.reshape(-1).data.cast("B")
    unpadded = _FIXED.size + _SHAPE_DIM.size * arr.ndim + len(model_b)
    header_len = -(-unpadded // PAYLOAD_ALIGN) * PAYLOAD_ALIGN
    if header_len > 0xFFFF:
        raise CodecError("header longer than 65535 bytes")
    header = bytearray(header_len)
    _FIXED.pack_into(
        header,
        0,
        MAGIC,
        VERSION,
        _KIND_CODE[kind],
        int(wire),
        arr.ndim,
        header_len,
        len(model_b),
        layer_range[0],
        layer_range[1],
        token_range[0],
        token_range[1],
        payload.nbytes,
        zlib.crc32(payload),
    )
    off = _FIXED.size
    dims: tuple[int, ...] = arr.shape
    for dim in dims:
        _SHAPE_DIM.pack_into(header, off, dim)
        off += _SHAPE_DIM.size
    header[off : off + len(model_b)] = model_b
    return bytes(header), payload


def encode(
    array: npt.ArrayLike,
    *,
    kind: EntryKind,
    model: str,
    layer_range: tuple[int, int] = (0, 0),
    token_range: tuple[int, int] = (0, 0),
    dtype: DType | None = None,
) -> bytes:
    """One buffer: header, then the payload (a single copy of the array's bytes)."""
    header, payload = encode_parts(
        array, kind=kind, model=model, layer_range=layer_range, token_range=token_range, dtype=dtype
    )
    return b"".join((header, payload))


def decode_header(buf: bytes | bytearray | memoryview) -> ValueHeader:
    mv = memoryview(buf).cast("B")
    if mv.nbytes < _FIXED.size:
        raise CodecError(f"truncated header: {mv.nbytes} bytes")
    (magic, version, kind, dtype, ndim, header_len, model_len, l0, l1, t0, t1, payload_len, crc) = (
        _FIXED.unpack_from(mv, 0)
    )
    if magic != MAGIC:
        raise CodecError(f"bad magic {bytes(magic)!r}")
    if version != VERSION:
        raise CodecError(f"unsupported version {version}")
    if kind not in _KIND_NAME:
        raise CodecError(f"unknown kind code {kind}")
    try:
        wire = DType(dtype)
    except ValueError:
        raise CodecError(f"unknown dtype code {dtype}") from None
    if ndim > MAX_NDIM or _FIXED.size + _SHAPE_DIM.size * ndim + model_len > header_len:
        raise CodecError("inconsistent header lengths")
    if mv.nbytes < header_len:
        raise CodecError(f"truncated header: {mv.nbytes} of {header_len} bytes")
    shape = tuple(_SHAPE_DIM.unpack_from(mv, _FIXED.size + _SHAPE_DIM.size * i)[0] for i in range(ndim))
    if int(np.prod(shape, dtype=np.uint64)) * CARRIER[wire].itemsize != payload_len:
        raise CodecError(f"shape {shape} of {wire.name} does not match payload_len {payload_len}")
    model_off = _FIXED.size + _SHAPE_DIM.size * ndim
    try:
        model = bytes(mv[model_off : model_off + model_len]).decode()
    except UnicodeDecodeError:
        raise CodecError("model name is not utf-8") from None
    return ValueHeader(
        kind=_KIND_NAME[kind],
        dtype=wire,
        shape=shape,
        model=model,
        layer_range=(l0, l1),
        token_range=(t0, t1),
        checksum=crc,
        payload_len=payload_len,
        header_len=header_len,
    )


def decode(buf: bytes | bytearray | memoryview, *, verify: bool = True) -> tuple[ValueHeader, np.ndarray]:
    """Header and a zero-copy numpy view of the payload (read-only when `buf` is `bytes`).

    `verify` checks the crc32 (one read pass over the payload, no copy).
    """
    header = decode_header(buf)
    mv = memoryview(buf).cast("B")
    end = header.header_len + header.payload_len
    if mv.nbytes < end:
        raise CodecError(f"truncated payload: {mv.nbytes - header.header_len} of {header.payload_len} bytes")
    payload = mv[header.header_len : end]
    if verify and zlib.crc32(payload) != header.checksum:
        raise CodecError("checksum mismatch: payload damaged")
    count = header.payload_len // CARRIER[header.dtype].itemsize
    array = np.frombuffer(payload, dtype=CARRIER[header.dtype], count=count).reshape(header.shape)
    return header, array


def float32_to_bfloat16(x: npt.ArrayLike) -> np.ndarray:
    """bfloat16 bit patterns (uint16) of `x`, rounded to nearest even; NaN stays NaN."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    rounded = ((bits + rounding) >> 16).astype(np.uint16)
    # A NaN whose payload sits in the low 16 bits would round to inf: keep it quiet-NaN instead.
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, ((bits >> 16) | 0x0040).astype(np.uint16), rounded)


def bfloat16_to_float32(bits: npt.ArrayLike) -> np.ndarray:
    """float32 values of bfloat16 bit patterns (exact: bfloat16 is float32's top half)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
