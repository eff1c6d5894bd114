"""The LLM-aware value encoding (header + aligned raw payload); it lives in the light client package
(`client/cachemesh_client/valuecodec.py`) so that writers of tensors (the vLLM connector) share it."""

from cachemesh_client.valuecodec import (
    CARRIER,
    MAGIC,
    MAX_NDIM,
    PAYLOAD_ALIGN,
    VERSION,
    CodecError,
    DType,
    ValueHeader,
    bfloat16_to_float32,
    decode,
    decode_header,
    encode,
    encode_parts,
    float32_to_bfloat16,
)

__all__ = [
    "CARRIER",
    "MAGIC",
    "MAX_NDIM",
    "PAYLOAD_ALIGN",
    "VERSION",
    "CodecError",
    "DType",
    "ValueHeader",
    "bfloat16_to_float32",
    "decode",
    "decode_header",
    "encode",
    "encode_parts",
    "float32_to_bfloat16",
]
