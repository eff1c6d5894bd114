"""`/docs` for every FastAPI app with swagger-ui served from the package (`swagger_ui/`), not a CDN, so
the page renders offline. Create the app with `docs_url=None, redoc_url=None`, then call `serve_docs`."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

SWAGGER_UI_DIR = Path(__file__).resolve().parent / "swagger_ui"
ASSETS = ("swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png")


def serve_docs(app: FastAPI, docs_url: str = "/docs") -> None:
    """Adds `docs_url` (swagger-ui over the app's OpenAPI document), its OAuth2 redirect page and the
    assets under `docs_url/static/`; none of them appear in the OpenAPI document."""
    static = f"{docs_url}/static"
    oauth2_redirect = f"{docs_url}/oauth2-redirect"
    app.mount(static, StaticFiles(directory=SWAGGER_UI_DIR), name="swagger-ui-static")

    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} - docs",
            swagger_js_url=f"{static}/swagger-ui-bundle.js",
            swagger_css_url=f"{static}/swagger-ui.css",
            swagger_favicon_url=f"{static}/favicon-32x32.png",
            oauth2_redirect_url=oauth2_redirect,
            # the validator badge would call validator.swagger.io
            swagger_ui_parameters={"validatorUrl": None},
        )

    async def redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    app.add_api_route(docs_url, docs, methods=["GET"], include_in_schema=False)
    app.add_api_route(oauth2_redirect, redirect, methods=["GET"], include_in_schema=False)
