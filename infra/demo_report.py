"""What `cachemesh demo` reports: its counts, the summary `--json` prints, the table's rows and what
each figure means."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class DemoReport:
    kv_events: int = 0
    blocks_stored: int = 0
    block_writes_failed: int = 0
    puts: int = 0
    writes_refused: int = 0  # puts the node still refused after waiting as it said (503 Retry-After)
    # Calls with no answer (a timeout, a dropped connection, a 5xx): counted, and the demo goes on.
    calls_failed: int = 0
    rewrites: int = 0
    asked: int = 0
    labels: int = 0  # explored misses the demo, knowing the answers, labelled (as the gateway does)
    chats: int = 0  # chat completions through the gateway
    chat_hits: int = 0  # of them answered from the cache (x-cachemesh-cache: hit)
    # The second asking's misses by why: the lookup lost a race with the model server ("hedged"), the
    # node's rule (x-cachemesh-miss), or "no reason given".
    chat_misses: dict[str, int] = field(default_factory=dict)
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)
    board_before: dict[str, int] = field(default_factory=dict)
    board_after: dict[str, int] = field(default_factory=dict)
    delta_t_ms: list[int] = field(default_factory=list)  # this run's warmups against their turns
    took_s: float = 0.0

    def _delta(self, key: str) -> int:
        return int(self.after.get(key) or 0) - int(self.before.get(key) or 0)

    def _board(self, key: str) -> int | None:
        return self.board_after[key] - self.board_before.get(key, 0) if key in self.board_after else None

    def summary(self) -> dict[str, Any]:
        """What `cachemesh demo --json` prints: this run's counts (the tier node's counters and the
        dashboard's totals before and after it; a dashboard count is null without a dashboard)."""
        return {
            "kv_events": self.kv_events,
            "blocks_stored": self.blocks_stored,
            "puts": self.puts,
            "writes_refused": self.writes_refused,
            "calls_failed": self.calls_failed,
            "asked": self.asked,
            "labels": self.labels,
            "chats": self.chats,
            "chat_hits": self.chat_hits,
            "chat_misses": dict(self.chat_misses),
            "lookups": self._delta("lookups"),
            "hits": self._delta("hits"),
            "warmups_applied": self._delta("commands"),
            "blocks_warmed": self._delta("warmed"),
            "invalidations": self._delta("invalidations_received"),
            "drift_clusters": self._board("drift_clusters"),
            "heat_decisions": self._board("heat_decisions"),
            "warmup_decisions": self._board("warmup_decisions"),
            "warmup_delta_t_ms": sorted(self.delta_t_ms),
            "took_s": round(self.took_s, 2),
        }

    def rows(self) -> list[tuple[str, str]]:
        def delta(key: str) -> int:
            return int(self.after.get(key) or 0) - int(self.before.get(key) or 0)

        lookups, hits = delta("lookups"), delta("hits")
        rows = [
            ("KV and access events sent (Mooncake)", str(self.kv_events)),
            ("KV blocks stored as the trace computed them", str(self.blocks_stored)),
            ("answers put / source documents rewritten", f"{self.puts} / {self.rewrites}"),
            *(
                [("writes refused (the node's L3 was unavailable)", str(self.writes_refused))]
                if self.writes_refused
                else []
            ),
            *(
                [("calls without an answer (timeout, dropped connection, 5xx)", str(self.calls_failed))]
                if self.calls_failed
                else []
            ),
            ("questions asked", str(self.asked)),
            ("explored misses labelled (the node learns its threshold from them)", str(self.labels)),
            *(
                [("chat completions through the gateway: from the cache", f"{self.chats}: {self.chat_hits}")]
                if self.chats
                else []
            ),
            ("lookups", str(lookups)),
            ("hits", f"{hits} ({hits / lookups:.0%})" if lookups else "0"),
        ]
        kinds_after = self.after.get("hits_by_tier") or {}
        kinds_before = self.before.get("hits_by_tier") or {}
        for kind in sorted(kinds_after):
            n = int(kinds_after[kind]) - int(kinds_before.get(kind, 0))
            if n:
                rows.append((f"  hits {kind}", str(n)))
        rows.append(
            (
                "warmups applied (tier node): blocks loaded / in place",
                f"{delta('commands')}: {delta('warmed')} / {delta('warm_already_held')}",
            )
        )
        if self.delta_t_ms:
            ordered = sorted(self.delta_t_ms)
            early = sum(d >= 0 for d in ordered)
            rows.append(
                (
                    "warmup Δt (turn - warm): median, before the turn",
                    f"{ordered[len(ordered) // 2] / 1000:.2f} s, {early} of {len(ordered)}",
                )
            )
        rows.append(("invalidations received (tier node)", str(delta("invalidations_received"))))
        for key, label in (
            ("warmup_decisions", "warmup decisions (dashboard)"),
            ("invalidations", "invalidation records (dashboard)"),
            ("heat_decisions", "heat decisions (dashboard)"),
            ("drift_clusters", "drift clusters (dashboard)"),
        ):
            if key in self.board_after:
                rows.append((label, str(self.board_after[key] - self.board_before.get(key, 0))))
        rows.append(("took", f"{self.took_s:.1f} s"))
        return rows


# One line per figure of the summary table: what made it and what it shows.
MEANING = {
    "KV and access events sent (Mooncake)": "a real trace's KV block events, time-compressed, on Kafka",
    "KV blocks stored as the trace computed them": "the demo stands in for the engine's KV connector",
    "answers put / source documents rewritten": "each answer cites a document; a rewrite invalidates it",
    "writes refused (the node's L3 was unavailable)": "503s left after waiting as the node said",
    "calls without an answer (timeout, dropped connection, 5xx)": "counted and passed over: a loaded machine",
    "questions asked": "paraphrases, word-for-word repeats and questions nothing answers",
    "explored misses labelled (the node learns its threshold from them)": (
        "a paraphrase is served once labels bound its error"
    ),
    "chat completions through the gateway: from the cache": (
        "each question asked twice: the model server answers once"
    ),
    "lookups": "the tier node's own count for this run (the gateway's included)",
    "hits": "repeats hit at once; paraphrases once the threshold is learned",
    "warmups applied (tier node): blocks loaded / in place": (
        "warmup's commands for next turns; in place: L2 still held them"
    ),
    "warmup Δt (turn - warm): median, before the turn": "how early the blocks were ready",
    "invalidations received (tier node)": "the rewrites' cascades, heard over Kafka",
    "warmup decisions (dashboard)": "warmup's warm / skip decisions on the conversations",
    "invalidation records (dashboard)": "one record per rewrite, with its dependants",
    "heat decisions (dashboard)": "heat's keep / demote / evict scores for the keys",
    "drift clusters (dashboard)": "streams' groups of keys accessed together",
    "took": "",
}
