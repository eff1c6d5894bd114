"""deploy/grafana/*.json conforms to Grafana's dashboard schema as grafana-foundation-sdk (a dev
dependency: `make setup` installs it) models it, and the check finds what the schema does not allow: an
unknown field, a value of the wrong type or outside an enum, a required field left out."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("grafana_foundation_sdk", reason="dev dependency: make setup installs it")

from deploy.check_grafana import DEFAULT_FILES, problems

DASHBOARD = json.loads((Path(__file__).resolve().parents[3] / "deploy/grafana/cachemesh.json").read_text())


def _graph(doc: dict[str, Any]) -> dict[str, Any]:
    return next(p for p in doc["panels"] if p["type"] == "timeseries")


def test_every_dashboard_in_deploy_conforms() -> None:
    assert DEFAULT_FILES
    for path in DEFAULT_FILES:
        assert problems(json.loads(path.read_text())) == [], path


@pytest.mark.parametrize(
    ("spoil", "expected"),
    [
        (lambda d: _graph(d).__setitem__("gridpos", _graph(d).pop("gridPos")), "/gridpos: not a field"),
        (lambda d: _graph(d)["targets"][0].__setitem__("legendFormt", "x"), "/legendFormt: not a field"),
        (lambda d: d.__setitem__("schemaVersion", "39"), "/schemaVersion: '39' is not int"),
        (lambda d: _graph(d)["gridPos"].__setitem__("h", "tall"), "/gridPos/h: 'tall' is not int"),
        (lambda d: _graph(d)["targets"][0].__setitem__("expr", 5), "/expr: 5 is not str"),
        (
            lambda d: _graph(d)["options"]["legend"].__setitem__("displayMode", "bogus"),
            "legend/displayMode: 'bogus' not in",
        ),
        (lambda d: d["templating"]["list"][0].__setitem__("type", "datasorce"), "/type: 'datasorce' not in"),
        (
            lambda d: _graph(d)["fieldConfig"]["defaults"].__setitem__("custom", {"drawStyle": "zigzag"}),
            "custom/drawStyle: 'zigzag' not in",
        ),
        (lambda d: _graph(d)["options"]["legend"].pop("calcs"), "legend/calcs: required by the schema"),
        (lambda d: d["templating"]["list"][0]["current"].pop("text"), "current/text: required by the schema"),
        (lambda d: _graph(d).pop("type"), "does not decode"),
    ],
)
def test_the_check_finds_what_the_schema_does_not_allow(
    spoil: Callable[[dict[str, Any]], object], expected: str
) -> None:
    doc = copy.deepcopy(DASHBOARD)
    spoil(doc)
    found = problems(doc)
    assert any(expected in line for line in found), found
