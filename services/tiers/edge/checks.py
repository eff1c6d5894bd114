"""Input checks of the tier API, each failing as a clear HTTP problem (422 malformed, 413 over its
bound, 503 with Retry-After while L3 cannot take a write)."""

import base64
import binascii
import math

import numpy as np
from fastapi import HTTPException

from schemas.events import MAX_KEY_CHARS
from services.tiers import codec
from services.tiers.edge.models import EmbeddingFields, PutBody, TensorIn, storable
from services.tiers.entry import encode_array, encode_text
from services.tiers.node.tiered import L3Unavailable, TieredCache

_DTYPES: dict[str, codec.DType] = {d.name.lower(): d for d in codec.DType}


def problem(code: int, message: str) -> HTTPException:
    return HTTPException(status_code=code, detail=message)


def unavailable(cache: TieredCache, exc: L3Unavailable) -> HTTPException:
    """503 with Retry-After: when L3's breaker may let the write through again (at least 1 s)."""
    retry_s = max(1, math.ceil(cache.breaker.retry_after_ms() / 1000))
    return HTTPException(status_code=503, detail=str(exc), headers={"Retry-After": str(retry_s)})


def embedding_of(fields: EmbeddingFields, dim: int) -> np.ndarray | None:
    if fields.embedding is not None and fields.embedding_b64 is not None:
        raise problem(422, "give embedding or embedding_b64, not both")
    if fields.embedding is not None:
        with np.errstate(over="ignore"):  # beyond float32 becomes inf, refused below
            vec = np.asarray(fields.embedding, dtype=np.float32)
    elif fields.embedding_b64 is not None:
        try:
            raw = base64.b64decode(fields.embedding_b64, validate=True)
        except (binascii.Error, ValueError):
            raise problem(422, "embedding_b64 is not valid base64") from None
        if len(raw) % 4:
            raise problem(422, f"embedding_b64 holds {len(raw)} bytes, not a whole number of float32")
        vec = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    else:
        return None
    if vec.size == 0:
        raise problem(422, "embedding is empty")
    if vec.shape != (dim,):
        raise problem(422, f"embedding has {vec.size} dimensions; this cache uses {dim}")
    if not np.all(np.isfinite(vec)):
        raise problem(422, "embedding must contain only finite numbers (no NaN or inf)")
    if not np.any(vec):
        raise problem(422, "embedding is all zeros: it has no direction to compare")
    return vec


def check_text(text: str, field: str, max_chars: int) -> str:
    if not text.strip():
        raise problem(422, f"{field} is empty")
    if len(text) > max_chars:
        raise problem(413, f"{field} has {len(text)} characters; the limit is {max_chars}")
    return text


def tensor_of(t: TensorIn, max_bytes: int) -> tuple[np.ndarray, codec.DType]:
    wire = _DTYPES[t.dtype]
    itemsize = codec.CARRIER[wire].itemsize
    count = math.prod(t.shape)
    if count * itemsize > max_bytes:
        raise problem(413, f"tensor of {count * itemsize} bytes; the limit is {max_bytes}")
    try:
        raw = base64.b64decode(t.data_b64, validate=True)
    except (binascii.Error, ValueError):
        raise problem(422, "tensor data_b64 is not valid base64") from None
    if len(raw) != count * itemsize:
        raise problem(
            422, f"tensor data has {len(raw)} bytes; shape {t.shape} of {t.dtype} needs {count * itemsize}"
        )
    array = np.frombuffer(raw, dtype=codec.CARRIER[wire]).reshape(t.shape)
    if wire in (codec.DType.FLOAT32, codec.DType.FLOAT16) and not np.all(np.isfinite(array)):
        raise problem(422, "tensor must contain only finite numbers (no NaN or inf)")
    return array, wire


def check_key(key: str) -> None:
    if not key:
        raise problem(422, "key is empty")
    if len(key) > MAX_KEY_CHARS:
        raise problem(413, f"key has {len(key)} characters; the limit is {MAX_KEY_CHARS}")
    check_storable(key, "key")


def check_storable(text: str | None, field: str) -> None:
    """A path or query string L3 can store (the bodies' fields are checked by their models)."""
    if text is not None:
        try:
            storable(text)
        except ValueError as exc:
            raise problem(422, f"{field} {exc}") from None


def encode_value(body: PutBody, max_bytes: int) -> bytes:
    value = body.value
    if (value.text is None) == (value.tensor is None):
        raise problem(422, "value needs exactly one of text or tensor")
    if value.text is not None:
        size = len(value.text.encode())
        if size > max_bytes:
            raise problem(413, f"value text is {size} bytes; the limit is {max_bytes}")
        if body.kind != "prompt":
            raise problem(422, "a text value is a prompt answer: kind must be 'prompt'")
        return encode_text(value.text, model=body.model)
    assert value.tensor is not None
    array, wire = tensor_of(value.tensor, max_bytes)
    lo, hi = body.layer_range
    t0, t1 = body.token_range
    if lo > hi or t0 > t1:
        raise problem(422, "layer_range and token_range must be [start, end] with start <= end")
    try:
        return encode_array(
            array, kind=body.kind, model=body.model, layer_range=(lo, hi), token_range=(t0, t1), dtype=wire
        )
    except codec.CodecError as exc:
        raise problem(422, str(exc)) from None
