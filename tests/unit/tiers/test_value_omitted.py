"""`value_omitted` says a hit came back without its value: asked for with `include_value: false`, or
left out of a batch over the response budget; a miss or a hit with its value says false."""

from __future__ import annotations

import httpx

from services.tiers.edge.api import create_app
from tests.unit.tiers.fakes import Clock
from tests.unit.tiers.test_api import make_cache, settings


async def test_value_omitted_follows_include_value_on_single_and_batch_lookups() -> None:
    app = create_app(make_cache(Clock()), settings())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tiers") as http:
        put = await http.put("/v1/entries/k1", json={"model": "m", "value": {"text": "Paris"}})
        assert put.status_code in (200, 201), put.text
        without = (await http.post("/v1/lookup", json={"key": "k1", "include_value": False})).json()
        assert without["hit"] and without["value"] is None and without["value_omitted"] is True
        full = (await http.post("/v1/lookup", json={"key": "k1"})).json()
        assert full["value"]["text"] == "Paris" and full["value_omitted"] is False
        miss = (await http.post("/v1/lookup", json={"key": "nope", "include_value": False})).json()
        assert not miss["hit"] and miss["value_omitted"] is False
        batch = (
            await http.post(
                "/v1/lookup/batch",
                json={"requests": [{"key": "k1", "include_value": False}, {"key": "k1"}, {"key": "nope"}]},
            )
        ).json()["results"]
        assert [r["value_omitted"] for r in batch] == [True, False, False]
        assert batch[1]["value"]["text"] == "Paris"
