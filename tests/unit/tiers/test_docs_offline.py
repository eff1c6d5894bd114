"""`/docs` renders offline, on the tiers API and the gateway: the page names only assets the app serves
itself (swagger-ui from the package), and they are served, with or without the bearer token on /v1."""

from __future__ import annotations

import re

import httpx
import pytest
from fastapi import FastAPI
from pydantic import SecretStr

from services.gateway.api import create_app as gateway_app
from services.gateway.settings import GatewaySettings
from services.runtime.docs import ASSETS, SWAGGER_UI_DIR
from services.tiers.edge.api import create_app
from tests.unit.tiers.fakes import Clock
from tests.unit.tiers.test_api import make_cache, settings


def _tiers(token: str | None) -> FastAPI:
    extra = {} if token is None else {"api_token": SecretStr(token)}
    return create_app(make_cache(Clock()), settings(**extra))


def _gateway(token: str | None) -> FastAPI:
    # /docs never reaches the proxy: the app is built around none.
    gw = GatewaySettings(
        api_token=None if token is None else SecretStr(token), kafka={"bootstrap": "unused:1"}
    )
    return gateway_app(None, gw, lambda: {})  # type: ignore[arg-type]


@pytest.mark.parametrize("make_app", [_tiers, _gateway], ids=["tiers", "gateway"])
@pytest.mark.parametrize("token", [None, "s3cret-token"])
async def test_docs_reference_only_local_assets_and_they_are_served(make_app, token: str | None) -> None:
    app = make_app(token)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tiers") as http:
        page = await http.get("/docs")
        assert page.status_code == 200
        refs = re.findall(r'(?:src|href)="([^"]+)"', page.text) + re.findall(r"url: '([^']+)'", page.text)
        assert refs, page.text
        assert all(r.startswith("/") and not r.startswith("//") for r in refs), refs
        assert "cdn" not in page.text.lower()
        for asset in ASSETS:
            assert f"/docs/static/{asset}" in refs
            got = await http.get(f"/docs/static/{asset}")
            assert got.status_code == 200, asset
            assert got.content == (SWAGGER_UI_DIR / asset).read_bytes()
        assert (await http.get("/openapi.json")).status_code == 200
        assert (await http.get("/docs/oauth2-redirect")).status_code == 200
        assert (await http.get("/redoc")).status_code == 404  # it would load from a CDN
        spec = (await http.get("/openapi.json")).json()
        assert not any(p.startswith("/docs") for p in spec["paths"])
