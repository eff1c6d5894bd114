"""Types of the compiled heat core (src/lib.rs)."""

import numpy as np
import numpy.typing as npt

REASONS: tuple[str, str, str, str, str]

class ChainHeat:
    def __init__(
        self,
        capacity: int,
        *,
        seed: int = 0,
        chain_reuse: bool = True,
        chain_reuse_weight: float = 0.5,
        chain_half_life: float = 3.0,
        rescore_ms: int = 100,
        rescore_accesses: int | None = None,
        neighbour_tau: float = 0.1,
        cold_cluster: float = 0.05,
        prior_recency: float = 0.5,
        chain_guard: bool = True,
    ) -> None: ...
    @property
    def capacity(self) -> int: ...
    @property
    def used(self) -> int: ...
    @property
    def tick(self) -> int: ...
    @property
    def rescores(self) -> int: ...
    def __contains__(self, key: int) -> bool: ...
    def __len__(self) -> int: ...
    def on_hit(
        self,
        key: int,
        now_ms: int,
        parent: int | None = None,
        trace: int | None = None,
        ttl_ms: int | None = None,
        cluster: int | None = None,
    ) -> None: ...
    def on_miss(
        self,
        key: int,
        now_ms: int,
        size: int = 1,
        parent: int | None = None,
        trace: int | None = None,
        ttl_ms: int | None = None,
        cluster: int | None = None,
    ) -> list[tuple[int, int]]: ...
    def remove(self, key: int) -> None: ...
    def end_trace(self, trace: int, evict: bool = True) -> list[tuple[int, int]]: ...
    def expire(self, now_ms: int) -> list[tuple[int, int]]: ...
    def rescore(self, now_ms: int | None = None) -> None: ...
    def observe_attention(self, key: int, heat: float) -> bool: ...
    def observe_cluster(self, key: int, cluster: int, distance: float) -> None: ...
    def heat(self, key: int) -> float | None: ...
    def table(
        self,
    ) -> tuple[
        npt.NDArray[np.int64],
        npt.NDArray[np.float32],
        npt.NDArray[np.float32],
        npt.NDArray[np.int64],
        npt.NDArray[np.bool_],
    ]: ...
    def replay_prefix(
        self, keys: npt.NDArray[np.int64], starts: npt.NDArray[np.int64], times: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.bool_]: ...
    def nbytes(self) -> int: ...
    def load_slot(
        self,
        slot: int,
        key: int,
        last_tick: int,
        crf: float,
        size: int,
        inserted_ms: int,
        ttl_ms: int,
        trace: int,
        depth: int,
        parent: int,
        children: int,
        freq: int,
        freq_epoch: int,
        cluster: int,
        distance: float,
        raw: float,
        eff: float,
        extended: bool,
        unscored: bool,
    ) -> None: ...
    def load_state(
        self,
        free: list[int],
        doomed: list[tuple[int, int]],
        ended: list[int],
        tick: int,
        now_ms: int,
        last_rescore_ms: int | None,
        last_rescore_tick: int,
        rescores: int,
    ) -> None: ...
    def load_ghosts(
        self, tag: npt.NDArray[np.int64], last: npt.NDArray[np.int64], crf: npt.NDArray[np.float32]
    ) -> None: ...
    def load_sketch(self, table: bytes, door: bytes, additions: int, resets: int) -> None: ...
    def guard_state(self) -> tuple[bool, int, int, int, int, int] | None:
        """(term on, windows, windows off, sampled accesses, hits with the term, hits without)."""
    def reuse_counts(self) -> tuple[list[float], list[float], int] | None: ...
    def load_reuse(self, yes: tuple[float, float], seen: tuple[float, float], labels: int) -> None: ...
    def load_reuse_pending(self, pending: list[tuple[int, int]], order: list[tuple[int, int]]) -> None: ...
    def start_chains(self) -> None: ...
