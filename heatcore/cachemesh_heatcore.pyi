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
        chain_half_lives: list[float] = [3.0, 10.0, 30.0],
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
    def changed(
        self, below: float
    ) -> tuple[
        npt.NDArray[np.int64],
        npt.NDArray[np.float32],
        npt.NDArray[np.int64],
        npt.NDArray[np.uint8],
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
    def guard_state(self) -> tuple[bool, int, int, int, int, int, float, int] | None:
        """(term on, windows, windows off, sampled accesses, hits with the term, hits without,
        half-life in use, half-life switches)."""
    def reuse_counts(self) -> tuple[list[float], list[float], int] | None: ...
    def load_reuse(self, yes: tuple[float, float], seen: tuple[float, float], labels: int) -> None: ...
    def load_reuse_pending(self, pending: list[tuple[int, int]], order: list[tuple[int, int]]) -> None: ...
    def start_chains(self) -> None: ...

class Panel:
    """`policies.learned.panel.ExpertPanel` compiled (src/panel.rs); keys are ints in [0, 2**64)."""

    def __init__(
        self,
        capacity: int,
        experts: list[str],
        *,
        seed: int = 0,
        sample: int = 1,
        horizons: list[float] = ...,
        sigmas: list[float] = ...,
        min_lead: float = 8.0,
        sketched: bool = False,
        sketch_seed: int = 0,
        owner_counts: bool = False,
        layout: tuple[int, ...] | None = None,
        prior_recency: float = 0.5,
    ) -> None: ...
    def set_heat(self, callable: object | None) -> None: ...
    def access(self, key: int, chained: bool = False) -> list[int]: ...
    def follow(self, expert: int, resident: list[int]) -> None: ...
    def remove(self, key: int) -> None: ...
    def holders(self, key: int) -> list[int]: ...
    def holds(self, key: int) -> bool: ...
    def driver_len(self) -> int: ...
    def lead(self, i: int, j: int, horizon: int = 0) -> float: ...
    def challengers(self) -> list[tuple[int, float]]: ...
    def missing(self, expert: int, resident: list[int]) -> float: ...
    def invalidate(self) -> None: ...
    def frequency(self, key: int) -> int: ...
    def count(self, key: int) -> None: ...
    @property
    def sketch_resets(self) -> int: ...
    def sketch_state(self) -> tuple[bytes, bytes, int, int]: ...
    @property
    def leader(self) -> int: ...
    @property
    def sample(self) -> int: ...
    @property
    def hits(self) -> list[int]: ...
    @property
    def switches(self) -> int: ...
    @property
    def contested(self) -> bool: ...
    @property
    def native_bytes(self) -> int: ...
