"""What is cached (pure): which requests may be answered from the cache and stored, what the caller's
headers ask (opt-out), and which upstream answers are worth keeping.

The default (`unset_or_zero`) caches requests at temperature 0 and those that leave it unset, apart;
what else is cached, what never is, and why: docs/gateway.md ("What is cached").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.gateway.requests import Normalised
from services.gateway.settings import SamplingPolicy

_TRUE = frozenset({"1", "true", "yes", "on"})
# Reasons a finished answer is complete enough to replay.
STORABLE_FINISH = frozenset({"stop", "length"})


@dataclass(frozen=True, slots=True)
class Plan:
    lookup: bool
    store: bool
    reason: str | None = None  # why not both, for the x-cachemesh-bypass-reason header

    @property
    def label(self) -> str:
        """x-cachemesh-cache for a request that was not served from the cache."""
        return "miss" if self.lookup else "bypass"


@dataclass(frozen=True, slots=True)
class Directives:
    """What the caller's headers ask: `x-cachemesh-bypass: 1` neither reads nor writes the cache;
    `Cache-Control: no-cache` asks for a fresh answer (which is stored); `no-store` keeps it out."""

    lookup: bool = True
    store: bool = True
    reason: str | None = None

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> Directives:
        if headers.get("x-cachemesh-bypass", "").strip().lower() in _TRUE:
            return cls(False, False, "x-cachemesh-bypass")
        tokens = {t.strip().lower() for t in headers.get("cache-control", "").split(",")}
        lookup, store = "no-cache" not in tokens, "no-store" not in tokens
        reason = None if lookup and store else "cache-control"
        return cls(lookup, store, reason)


@dataclass(frozen=True, slots=True)
class CachePolicy:
    sampling: SamplingPolicy = "unset_or_zero"
    cache_tools: bool = False

    def not_cacheable(self, req: Normalised) -> str | None:
        """Why `req` is neither served from nor stored in the cache; None when it may be."""
        if req.n > 1:
            return "n>1"
        if req.several_prompts:
            return "several prompts"
        if req.logprobs:
            return "logprobs"
        if req.uses_tools and not self.cache_tools:
            return "tools"
        if req.seed is not None or self.sampling == "all":
            return None
        if req.temperature is None:
            return "temperature unset" if self.sampling == "deterministic" else None
        return "temperature>0" if req.temperature > 0 else None

    def plan(self, req: Normalised, directives: Directives) -> Plan:
        reason = self.not_cacheable(req)
        if reason is not None:
            return Plan(False, False, reason)
        return Plan(directives.lookup, directives.store, directives.reason)

    def storable(self, answer: Mapping[str, Any]) -> bool:
        """An upstream answer worth replaying: every choice finished normally, has text, and (unless
        `cache_tools`) calls no tool."""
        choices = answer.get("choices")
        if not isinstance(choices, list) or not choices:
            return False
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("finish_reason") not in STORABLE_FINISH:
                return False
            message = choice.get("message")
            if isinstance(message, dict):
                if message.get("tool_calls") or message.get("function_call"):
                    if not self.cache_tools:
                        return False
                elif not message.get("content"):
                    return False
            elif not choice.get("text"):
                return False
        return True
