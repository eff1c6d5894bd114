from __future__ import annotations

import numpy as np
import pytest

from services.tiers.codec import (
    CARRIER,
    PAYLOAD_ALIGN,
    CodecError,
    DType,
    bfloat16_to_float32,
    decode,
    decode_header,
    encode,
    encode_parts,
    float32_to_bfloat16,
)

RNG = np.random.default_rng(7)


def _sample(dtype: DType, shape: tuple[int, ...]) -> np.ndarray:
    carrier = CARRIER[dtype]
    if dtype is DType.BFLOAT16:
        return float32_to_bfloat16(RNG.standard_normal(shape).astype(np.float32))
    if carrier.kind == "f":
        return RNG.standard_normal(shape).astype(carrier)
    info = np.iinfo(carrier)
    return RNG.integers(info.min, info.max, size=shape, endpoint=True, dtype=carrier)


CASES = [
    # dtype, shape, kind, layer_range, token_range
    (DType.FLOAT32, (384,), "embedding", (0, 0), (0, 0)),
    (DType.FLOAT16, (2, 8, 16, 128), "kv_block", (0, 32), (512, 528)),
    (DType.BFLOAT16, (2, 4, 16, 64), "kv_block", (8, 16), (0, 16)),
    (DType.INT8, (2, 4, 16, 64), "kv_block", (31, 32), (1024, 1040)),
    (DType.UINT8, (57,), "prompt", (0, 0), (0, 0)),
    (DType.INT32, (17,), "prompt", (0, 0), (0, 17)),
    (DType.INT64, (3, 5), "embedding", (0, 0), (0, 0)),
    (DType.FLOAT32, (), "embedding", (0, 0), (0, 0)),
    (DType.FLOAT16, (0, 128), "kv_block", (0, 1), (0, 0)),
]


@pytest.mark.parametrize(("dtype", "shape", "kind", "layers", "tokens"), CASES)
def test_round_trip_every_dtype(dtype, shape, kind, layers, tokens) -> None:
    arr = _sample(dtype, shape)
    buf = encode(arr, kind=kind, model="llama-3-8b", layer_range=layers, token_range=tokens, dtype=dtype)
    header, out = decode(buf)
    assert header.kind == kind
    assert header.dtype is dtype
    assert header.shape == shape
    assert header.model == "llama-3-8b"
    assert header.layer_range == layers
    assert header.token_range == tokens
    assert header.payload_len == arr.nbytes
    assert header.header_len % PAYLOAD_ALIGN == 0
    assert out.dtype == CARRIER[dtype]
    np.testing.assert_array_equal(out, arr)


@pytest.mark.parametrize("dtype", [DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16, DType.INT8])
def test_decode_is_zero_copy(dtype: DType) -> None:
    buf = bytearray(encode(_sample(dtype, (4, 64)), kind="kv_block", model="m", dtype=dtype))
    _, out = decode(buf)
    assert np.shares_memory(out, np.frombuffer(buf, dtype=np.uint8))
    assert out.ctypes.data % PAYLOAD_ALIGN == np.frombuffer(buf, np.uint8).ctypes.data % PAYLOAD_ALIGN
    out[0, 0] = 0  # a bytearray buffer gives a writable view that writes through
    assert decode(bytes(buf), verify=False)[1][0, 0] == 0


def test_bytes_buffer_gives_read_only_view() -> None:
    _, out = decode(encode(np.arange(4, dtype=np.float32), kind="embedding", model="m"))
    assert not out.flags.writeable


def test_bfloat16_is_inferred_only_when_asked() -> None:
    bits = float32_to_bfloat16(np.array([1.0, -2.0], np.float32))
    with pytest.raises(CodecError, match="unsupported dtype"):
        encode(bits, kind="kv_block", model="m")  # raw uint16 is ambiguous: say it is bfloat16
    header, out = decode(encode(bits, kind="kv_block", model="m", dtype=DType.BFLOAT16))
    assert header.dtype is DType.BFLOAT16
    np.testing.assert_array_equal(bfloat16_to_float32(out), [1.0, -2.0])


def test_encode_parts_scatter_matches_encode() -> None:
    arr = _sample(DType.FLOAT16, (3, 7))
    head, payload = encode_parts(arr, kind="kv_block", model="m")
    assert head + bytes(payload) == encode(arr, kind="kv_block", model="m")


def test_non_native_inputs_are_normalised() -> None:
    big_endian = np.arange(6, dtype=">f4")
    np.testing.assert_array_equal(decode(encode(big_endian, kind="embedding", model="m"))[1], big_endian)
    strided = np.arange(20, dtype=np.int8).reshape(4, 5)[:, ::2]
    np.testing.assert_array_equal(decode(encode(strided, kind="prompt", model="m"))[1], strided)


@pytest.mark.parametrize(
    ("value", "bits"),
    [
        (1.0, 0x3F80),
        (-2.0, 0xC000),
        (0.0, 0x0000),
        (-0.0, 0x8000),
        (float("inf"), 0x7F80),
        (1.0 + 2**-8, 0x3F80),  # halfway: ties to even (down)
        (1.0 + 3 * 2**-8, 0x3F82),  # halfway: ties to even (up)
        (1.0 + 2**-8 + 2**-20, 0x3F81),  # above halfway: up
        (3.4028235e38, 0x7F80),  # float32 max rounds to inf
    ],
)
def test_bfloat16_rounds_to_nearest_even(value: float, bits: int) -> None:
    assert int(float32_to_bfloat16(np.array([value], np.float32))[0]) == bits


def test_bfloat16_nan_stays_nan() -> None:
    nan_low_payload = np.array([0x7F800001], dtype=np.uint32).view(np.float32)
    assert np.isnan(bfloat16_to_float32(float32_to_bfloat16(nan_low_payload)))[0]


def test_checksum_catches_damage() -> None:
    buf = bytearray(encode(np.arange(64, dtype=np.float32), kind="embedding", model="m"))
    buf[-1] ^= 0xFF
    with pytest.raises(CodecError, match="checksum"):
        decode(buf)
    decode(buf, verify=False)  # opting out of the scan still decodes


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b"XXXX" + b[4:], "magic"),
        (lambda b: b[:4] + bytes([9]) + b[5:], "version"),
        (lambda b: b[:20], "truncated"),
        (lambda b: b[:-1], "truncated payload"),
        (lambda b: b[:5] + bytes([7]) + b[6:], "kind"),
        (lambda b: b[:6] + bytes([99]) + b[7:], "dtype"),
        (lambda b: b[:6] + bytes([DType.INT8]) + b[7:], "does not match"),
    ],
)
def test_malformed_buffers_are_rejected(mutate, message: str) -> None:
    buf = encode(np.arange(8, dtype=np.float32), kind="embedding", model="m")
    with pytest.raises(CodecError, match=message):
        decode(mutate(buf))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"array": np.zeros(2, np.float64)}, "unsupported dtype"),
        ({"array": np.zeros(2, np.float32), "dtype": DType.INT8}, "cannot be carried"),
        ({"array": np.zeros(2, np.float32), "kind": "answer"}, "unknown kind"),
        ({"array": np.zeros(2, np.float32), "layer_range": (4, 2)}, "layer_range"),
        ({"array": np.zeros((1,) * 9, np.float32)}, "dimensions"),
    ],
)
def test_encode_rejects(kwargs: dict, message: str) -> None:
    args = {"kind": "embedding", "model": "m", **kwargs}
    array = args.pop("array")
    with pytest.raises(CodecError, match=message):
        encode(array, **args)


def test_header_alone_can_be_read_from_a_prefix() -> None:
    buf = encode(np.zeros((2, 2048), np.float16), kind="kv_block", model="qwen", token_range=(0, 16))
    header = decode_header(buf[:128])
    assert (header.shape, header.model, header.token_range) == ((2, 2048), "qwen", (0, 16))
