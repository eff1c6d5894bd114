"""An HTTP API fuzzed from its own live OpenAPI document with schemathesis: every operation, schema-valid
and schema-breaking requests alike. Shared by the tier node's and the gateway's fuzz tests."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import hypothesis
import requests
import schemathesis
from hypothesis import HealthCheck, Phase
from schemathesis import GenerationMode

# Examples per operation and generation mode: bounds a whole run to under a minute. A deeper, random
# run: CACHEMESH_FUZZ_EXAMPLES=300 (raise the test timeout with it).
MAX_EXAMPLES = int(os.environ.get("CACHEMESH_FUZZ_EXAMPLES", "12"))
DERANDOMIZE = "CACHEMESH_FUZZ_EXAMPLES" not in os.environ
REQUEST_TIMEOUT_S = 5.0

Problem = Callable[[Any, requests.Response], "str | None"]


def fuzz(
    base_url: str, headers: dict[str, str], problem: Problem, timeout_s: float = REQUEST_TIMEOUT_S
) -> tuple[int, list[str]]:
    """(requests sent, problems found): `problem(case, response)` says what is wrong with one answer.
    Blocking (schemathesis sends with requests): run it off the server's event loop."""
    document = requests.get(f"{base_url}/openapi.json", timeout=timeout_s).json()
    schema = schemathesis.openapi.from_dict(document)
    problems: list[str] = []
    sent = 0
    session = requests.Session()
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @hypothesis.settings(
                max_examples=MAX_EXAMPLES,
                deadline=None,
                database=None,
                derandomize=DERANDOMIZE,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
            def one(case: Any) -> None:
                nonlocal sent
                sent += 1
                try:
                    response = case.call(
                        base_url=base_url, session=session, headers=headers, timeout=timeout_s
                    )
                except requests.RequestException as exc:
                    problems.append(f"{case.method} {case.formatted_path}: no answer ({exc!r})")
                    return
                if (found := problem(case, response)) is not None:
                    body = case.body if isinstance(case.body, (dict, list)) else repr(case.body)[:200]
                    problems.append(f"{found}; sent query={case.query} body={json.dumps(body)[:300]}")

            try:
                one()
            except hypothesis.errors.Unsatisfiable:
                continue  # nothing in this operation to break (no parameters, no body): no negative case
    return sent, problems
