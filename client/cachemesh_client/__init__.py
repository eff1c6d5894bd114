"""cachemesh-client: the Python client of a cachemesh tier node's HTTP API (httpx; numpy for tensors)."""

from cachemesh_client.client import (
    VALUE_MEDIA_TYPE,
    AsyncTiersClient,
    FetchedBlock,
    LookupRequest,
    LookupResult,
    PrefixBlock,
    PrefixResult,
    TiersClient,
    TiersError,
)

__all__ = [
    "VALUE_MEDIA_TYPE",
    "AsyncTiersClient",
    "FetchedBlock",
    "LookupRequest",
    "LookupResult",
    "PrefixBlock",
    "PrefixResult",
    "TiersClient",
    "TiersError",
]
__version__ = "0.1.0"
