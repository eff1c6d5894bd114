"""cachemesh-client: the Python client of a cachemesh tier node's HTTP API (httpx and numpy only)."""

from cachemesh_client.client import (
    VALUE_MEDIA_TYPE,
    AsyncTiersClient,
    LookupRequest,
    LookupResult,
    TiersClient,
    TiersError,
)

__all__ = [
    "VALUE_MEDIA_TYPE",
    "AsyncTiersClient",
    "LookupRequest",
    "LookupResult",
    "TiersClient",
    "TiersError",
]
__version__ = "0.1.0"
