"""The published OpenAPI document (schemas/openapi/tiers.json) is the one the API serves."""

from __future__ import annotations

import json
from pathlib import Path

from services.tiers.edge.api import openapi_document

PUBLISHED = Path(__file__).resolve().parents[3] / "schemas" / "openapi" / "tiers.json"


def test_published_openapi_matches_the_app() -> None:
    current = json.loads(json.dumps(openapi_document(), sort_keys=True))
    assert json.loads(PUBLISHED.read_text()) == current, (
        "the API changed: refresh with `python -m services.tiers.edge.api > schemas/openapi/tiers.json`"
    )
    paths = set(current["paths"])
    assert {"/v1/lookup", "/v1/lookup/batch", "/v1/entries/{key}", "/v1/values/{key}", "/v1/stats"} <= paths
