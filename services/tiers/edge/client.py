"""The tier node's Python client lives in the light `cachemesh-client` package (`client/` in this repo:
`pip install ./client`, no server dependencies); re-exported here for the server's tests and benches."""

from cachemesh_client.client import (
    CARRIER,
    DEFAULT_BATCH,
    VALUE_MEDIA_TYPE,
    AsyncTiersClient,
    FetchedBlock,
    LookupRequest,
    LookupResult,
    PrefixBlock,
    PrefixResult,
    TiersClient,
    TiersError,
    lookup_body,
    parse_lookup,
    parse_prefix,
    parse_value,
    prefix_body,
    put_body,
)

__all__ = [
    "CARRIER",
    "DEFAULT_BATCH",
    "VALUE_MEDIA_TYPE",
    "AsyncTiersClient",
    "FetchedBlock",
    "LookupRequest",
    "LookupResult",
    "PrefixBlock",
    "PrefixResult",
    "TiersClient",
    "TiersError",
    "lookup_body",
    "parse_lookup",
    "parse_prefix",
    "parse_value",
    "prefix_body",
    "put_body",
]
