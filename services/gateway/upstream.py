"""The upstream model server (any OpenAI-compatible one: vLLM, TGI, llama.cpp, OpenAI) over httpx,
behind the failure breaker: 5xx, timeouts and refused connections count against it; what it refuses
(4xx) is the caller's problem and does not. Failures it cannot relay as the upstream's own answer
become `UpstreamUnavailable` (502 unreachable, 503 breaker open, 504 timeout)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping

import httpx

from services.runtime.breaker import FailureBreaker

# Request headers passed on to the upstream besides the body's type and the credentials.
_PASSED = ("x-request-id", "traceparent", "tracestate", "openai-organization", "openai-project")


class UpstreamUnavailable(Exception):
    def __init__(self, status: int, message: str, *, code: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.retry_after_s = retry_after_s


class Upstream:
    def __init__(
        self,
        http: httpx.AsyncClient,
        breaker: FailureBreaker,
        *,
        timeout_s: float,
        api_key: str | None = None,
        pass_authorization: bool = False,
    ) -> None:
        self.http = http
        self.breaker = breaker
        self.timeout_s = timeout_s
        self.api_key = api_key
        self.pass_authorization = pass_authorization
        self.calls = 0

    def headers(self, incoming: Mapping[str, str]) -> dict[str, str]:
        out = {"content-type": "application/json"}
        if self.api_key is not None:
            out["authorization"] = f"Bearer {self.api_key}"
        elif self.pass_authorization and "authorization" in incoming:
            out["authorization"] = incoming["authorization"]
        out.update({h: incoming[h] for h in _PASSED if h in incoming})
        return out

    def _admit(self) -> None:
        if not self.breaker.allow():
            wait_s = math.ceil(self.breaker.retry_after_ms() / 1000) or 1
            raise UpstreamUnavailable(
                503,
                f"upstream circuit breaker open ({self.breaker.reason}); retry in {wait_s} s",
                code="upstream_breaker_open",
                retry_after_s=wait_s,
            )
        self.calls += 1

    def _failed(self, exc: Exception) -> UpstreamUnavailable:
        self.breaker.record(False)
        if isinstance(exc, TimeoutError | httpx.TimeoutException):
            return UpstreamUnavailable(
                504, f"upstream did not answer within {self.timeout_s:g} s", code="upstream_timeout"
            )
        return UpstreamUnavailable(502, f"upstream unreachable: {exc!r}", code="upstream_unreachable")

    async def request(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes | None = None
    ) -> httpx.Response:
        """One whole exchange (read to the end), within `timeout_s`."""
        self._admit()
        try:
            async with asyncio.timeout(self.timeout_s):
                response = await self.http.request(method, path, content=body, headers=dict(headers))
        except asyncio.CancelledError:
            self.breaker.abandon()
            raise
        except (TimeoutError, httpx.HTTPError) as exc:
            raise self._failed(exc) from None
        self.breaker.record(response.status_code < 500)
        return response

    async def open_stream(self, path: str, headers: Mapping[str, str], body: bytes) -> httpx.Response:
        """A streamed exchange, open once the status and headers are in; the caller reads it and then
        reports with `stream_done` (an error status is read to the end and reported here)."""
        self._admit()
        request = self.http.build_request("POST", path, content=body, headers=dict(headers))
        try:
            async with asyncio.timeout(self.timeout_s):
                response = await self.http.send(request, stream=True)
                if response.status_code != 200:
                    await response.aread()
        except asyncio.CancelledError:
            self.breaker.abandon()
            raise
        except (TimeoutError, httpx.HTTPError) as exc:
            raise self._failed(exc) from None
        if response.status_code != 200:
            await response.aclose()
            self.breaker.record(response.status_code < 500)
        return response

    def stream_done(self, ok: bool) -> None:
        self.breaker.record(ok)
