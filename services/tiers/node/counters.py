"""What one node counts about its reads, writes and commands (`Placement.counters`; /v1/stats reports
them)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Counters:
    lookups: int = 0
    hits: Counter[str] = field(default_factory=Counter)  # "l1:exact", "l3:semantic", ...
    misses: int = 0
    degraded_lookups: int = 0
    puts: int = 0
    deletes: int = 0
    stamps_retaken: int = 0  # writes stamped again: another write of the key had taken the stamp in L3
    invalidations_received: int = 0
    invalidations_repeated: int = 0  # one already applied, sent again (the outbox relay): ignored
    invalidated_entries: int = 0
    heat_evictions: int = 0
    heat_keep_alives: int = 0
    commands: int = 0
    warmed: int = 0
    warm_already_held: int = 0  # keys a warmup command found where it would have put them
    conversations_ended: int = 0
    context_dropped: int = 0
    l3_errors: int = 0
    l3_written_behind: int = 0
    remote_hits: int = 0
    remote_rejected: int = 0  # found on a peer but expired or of another model
    remote_failures: int = 0  # the port raised (it should not): counted, the lookup went on
    peers_skipped: int = 0  # lookups that did not ask the peers' L2: the node was local-only
    fenced: int = 0  # a copy found older than a write this node heard of: answered as a miss
    unheard_lookups: int = 0  # walked to L3 alone: this node did not hear invalidations then
    forgotten: int = 0  # entries dropped from L1/L2 when the node heard again after not hearing
