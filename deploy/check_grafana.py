"""Checks Grafana dashboard JSON against Grafana's dashboard schema as grafana-foundation-sdk (Grafana's
types generated from that schema, a dev dependency) models it: `python -m deploy.check_grafana [FILE...]`.

The SDK decodes leniently, so three checks are made on top of it: every key survives a decode/encode
round trip (an unknown or misspelt field is dropped by the SDK's types), every field the schema requires
is there (the SDK fills one in silently), and every value has the type, enum member or literal the schema
gives it (panel options and field config through the SDK's panel plugins, the PromQL targets through its
Prometheus query type). The Go SDK's strict decoder (`UnmarshalJSONStrict`, then `Validate`) agreed with
the first two on deploy/grafana/cachemesh.json; it does not look at enum values."""

from __future__ import annotations

import enum
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

DEFAULT_FILES = sorted((Path(__file__).resolve().parent / "grafana").glob("*.json"))


def problems(doc: dict[str, Any]) -> list[str]:
    """Everything in `doc` the schema does not allow; empty when it conforms."""
    from grafana_foundation_sdk.cog import plugins
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    plugins.register_default_plugins()
    try:
        model = Dashboard.from_json(doc)
    except (KeyError, TypeError, AttributeError) as exc:
        return [f"does not decode as a dashboard: {exc!r}"]
    out: list[str] = []
    _typed(model, doc, "", out)
    _kept(doc, json.loads(json.dumps(model, cls=JSONEncoder)), "", out)
    return out


def _json_key(attribute: str) -> str:
    """The JSON name of an SDK attribute (`grid_pos` -> `gridPos`; `type_val` -> `type`)."""
    head, *rest = attribute.removesuffix("_val").split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _optional(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)


def _kept(given: Any, encoded: Any, path: str, out: list[str]) -> None:
    """Every key of `given` is still in what the SDK's types encode back."""
    if isinstance(given, dict) and isinstance(encoded, dict):
        for key, value in given.items():
            if key not in encoded:
                out.append(f"{path}/{key}: not a field of the schema")
            else:
                _kept(value, encoded[key], f"{path}/{key}", out)
    elif isinstance(given, list) and isinstance(encoded, list) and len(given) == len(encoded):
        for i, (a, b) in enumerate(zip(given, encoded, strict=True)):
            _kept(a, b, f"{path}[{i}]", out)


def _typed(model: Any, source: Any, path: str, out: list[str]) -> None:
    """Every attribute of a decoded SDK object holds what its annotation (the schema's type) says, and
    every one the schema requires (not Optional) was in `source`, the JSON it was decoded from (the SDK
    would fill it in silently)."""
    hints = typing.get_type_hints(type(model))
    given = source if isinstance(source, dict) else {}
    for name, hint in hints.items():
        if not hasattr(model, name):
            continue
        key = _json_key(name)
        if key not in given and not _optional(hint):
            out.append(f"{path}/{key}: required by the schema, missing")
            continue
        error = _check(getattr(model, name), hint, given.get(key), f"{path}/{key}", out)
        if error:
            out.append(error)


def _check(value: Any, hint: Any, source: Any, path: str, out: list[str]) -> str | None:
    """None when `value` (decoded from `source`) fits `hint` (nested SDK objects are checked into
    `out`), else the problem."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any or hint is object:
        # Panel options and field config: typed by the panel plugin the SDK decoded them with.
        if type(value).__module__.startswith("grafana_foundation_sdk.models"):
            _typed(value, source, path, out)
        return None
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        candidates = [a for a in args if a is not type(None)]
        if len(candidates) == 1:
            return _check(value, candidates[0], source, path, out)
        partial: list[str] | None = None
        for arg in candidates:
            nested: list[str] = []
            if _check(value, arg, source, path, nested) is None:
                if not nested:
                    return None
                partial = partial if partial is not None else nested  # the right shape, wrong inside
        if partial is not None:
            out.extend(partial)
            return None
        return f"{path}: {value!r:.60} is none of {[getattr(a, '__name__', str(a)) for a in candidates]}"
    if origin is typing.Literal:
        return None if value in args else f"{path}: {value!r:.60} is not one of {list(args)}"
    if value is None:
        return None if hint is type(None) else f"{path}: missing"
    if origin is list:
        if not isinstance(value, list):
            return f"{path}: {value!r:.60} is not a list"
        items = source if isinstance(source, list) and len(source) == len(value) else [None] * len(value)
        for i, (item, given) in enumerate(zip(value, items, strict=True)):
            error = _check(item, args[0] if args else Any, given, f"{path}[{i}]", out)
            if error:
                out.append(error)
        return None
    if origin is dict:
        return None if isinstance(value, dict) else f"{path}: {value!r:.60} is not an object"
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        known = {m.value for m in hint}
        ok = value in known or isinstance(value, hint)
        return None if ok else f"{path}: {value!r} not in {sorted(known)}"
    if hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return None if ok else f"{path}: {value!r:.60} is not a number"
    if hint in (int, str, bool):
        ok = isinstance(value, hint) and not (hint is int and isinstance(value, bool))
        return None if ok else f"{path}: {value!r:.60} is not {hint.__name__}"
    if isinstance(hint, type):
        if not isinstance(value, hint):
            return f"{path}: {type(value).__name__} where the schema has {hint.__name__}"
        if type(value).__module__.startswith("grafana_foundation_sdk.models"):
            _typed(value, source, path, out)
        return None
    return None


def main(argv: list[str]) -> int:
    files = [Path(a) for a in argv] or DEFAULT_FILES
    failed = 0
    for path in files:
        found = problems(json.loads(path.read_text()))
        failed += bool(found)
        print(f"{path}: {'ok' if not found else f'{len(found)} problem(s)'}")
        for line in found:
            print(f"  {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
