"""The worker's own pages, served by the service's metrics server next to /metrics and /healthz:
`/windows/` and `/drift/` (the latest window per group, the latest clusters per shard) and
`/table/...` (the tables faust's web views used to list, with the same shapes)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from streams.app import StreamsApp


def _json(value: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(value, default=str), status=status, content_type="application/json")


def routes(streams: StreamsApp) -> list[web.RouteDef]:
    # faust types its tables as collections, without the store (`data`) that tables have.
    by_name: dict[str, Any] = dict(streams.app.tables)

    async def windows(_: web.Request) -> web.Response:
        return _json([streams.latest_windows[k] for k in sorted(streams.latest_windows)])

    async def drift(_: web.Request) -> web.Response:
        return _json(streams.latest_drift)

    def table_info(table: Any) -> dict[str, str]:
        return {"name": table.name, "help": table.help}

    async def tables(_: web.Request) -> web.Response:
        return _json([table_info(t) for t in by_name.values()])

    async def table(request: web.Request) -> web.Response:
        found = by_name.get(request.match_info["name"])
        if found is None:
            return _json({"error": "unknown table", "name": request.match_info["name"]}, 404)
        return _json(table_info(found))

    async def table_key(request: web.Request) -> web.Response:
        name, key = request.match_info["name"], request.match_info["key"]
        found = by_name.get(name)
        if found is None:
            return _json({"error": "unknown table", "name": name}, 404)
        # This worker's copy only, as faust's view answered for the partitions it owned.
        value = found.data.get(key)
        if value is None:
            return _json({"error": "key not found", "table": name, "key": key}, 404)
        return _json(value)

    return [
        web.get("/windows/", windows),
        web.get("/drift/", drift),
        web.get("/table/", tables),
        web.get("/table/{name}/", table),
        web.get("/table/{name}/{key}/", table_key),
    ]
