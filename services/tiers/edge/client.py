"""The tier node's Python client lives in the light `cachemesh-client` package (`client/` in this repo:
`pip install ./client`, no server dependencies); re-exported here for the server's tests and benches."""

from cachemesh_client.client import (
    CARRIER,
    VALUE_MEDIA_TYPE,
    AsyncTiersClient,
    LookupRequest,
    LookupResult,
    TiersClient,
    TiersError,
    lookup_body,
    parse_lookup,
    parse_value,
    put_body,
)

__all__ = [
    "CARRIER",
    "VALUE_MEDIA_TYPE",
    "AsyncTiersClient",
    "LookupRequest",
    "LookupResult",
    "TiersClient",
    "TiersError",
    "lookup_body",
    "parse_lookup",
    "parse_value",
    "put_body",
]
