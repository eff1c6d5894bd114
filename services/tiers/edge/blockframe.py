"""The binary frame of `POST /v1/blocks/fetch` (many KV blocks in one body); it lives in the light
client package (`client/cachemesh_client/blockframe.py`), re-exported here for the server's route."""

from cachemesh_client.blockframe import (
    MAGIC,
    MEDIA_TYPE,
    VERSION,
    FetchedBlock,
    FrameError,
    encode_blocks,
    frame_parts,
    parse_blocks,
)

__all__ = [
    "MAGIC",
    "MEDIA_TYPE",
    "VERSION",
    "FetchedBlock",
    "FrameError",
    "encode_blocks",
    "frame_parts",
    "parse_blocks",
]
