"""`ExpertPanel` compiled: the face of `panel.ExpertPanel` over `cachemesh_heatcore.Panel` (Rust,
heatcore/src/panel.rs), which runs the experts, the miniatures and the evidence in one call per access.

Keys cross as 64-bit ints: an int in [0, 2**64) as it is, any other key as its digest
(`sketch.key_digest`, what the sketch hashes); `access` and `keys` give back those ints, and the caller
maps them to its keys. On int keys the decisions are the Python panel's, access for access
(tests/unit/policies/test_panel_core.py); other keys are sampled by their digest rather than by their
own hash, so the miniatures see a different (equally random) sample.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence

import numpy as np
from cachemesh_heatcore import Panel

from policies.adaptive.wtinylfu import WTinyLFU
from policies.admission.sketch import FrequencySketch, key_digest
from policies.learned.features import FEATURES
from policies.learned.panel import (
    HORIZONS,
    MIN_LEAD,
    MIN_MINIATURE,
    SIGMAS,
    ExpertPanel,
    SketchedFactory,
    sample_rate,
)

COMPILED_EXPERTS = frozenset(
    {"lru", "arc", "lirs", "wtinylfu", "s3fifo", "s3fifo-lcs", "sieve", "heat-frame"}
)
# Where the frame's features sit in `features.FEATURES` rows: (width, recency, interval, frequency,
# hits, size, ttl_left, trace_alive).
_FRAME_FEATURES = ("recency", "interval", "frequency", "hits", "size", "ttl_left", "trace_alive")
LAYOUT = (len(FEATURES), *(FEATURES.index(f) for f in _FRAME_FEATURES))
_M64 = (1 << 64) - 1


def panel_key(key: Hashable) -> int:
    """The int a key crosses as."""
    return key if type(key) is int and 0 <= key <= _M64 else key_digest(key)


def same_key(key: Hashable) -> bool:
    """Whether `key` crosses as itself."""
    return type(key) is int and 0 <= key <= _M64


class PanelSketch:
    """`FrequencySketch`'s face (increment, frequency, resets, seed, state) over the sketch the
    compiled panel holds for its owner: one sketch, counted once, that the owner and the experts read."""

    def __init__(self, core: Panel, seed: int) -> None:
        self.core = core
        self.seed = seed

    # (`panel_key` written out: these run on every access)
    def increment(self, key: Hashable) -> None:
        self.core.count(key if type(key) is int and 0 <= key <= _M64 else key_digest(key))

    def frequency(self, key: Hashable) -> int:
        return self.core.frequency(key if type(key) is int and 0 <= key <= _M64 else key_digest(key))

    @property
    def resets(self) -> int:
        return self.core.sketch_resets

    def state(self) -> tuple[bytes, bytes, int, int]:
        return self.core.sketch_state()


class CompiledPanel:
    """`ExpertPanel`'s interface (the part the heat policy uses). `sketched`: W-TinyLFU and the frame
    read the sketch of the owner, seeded `sketch_seed`, which the core counts alongside it (the owner
    counts its own before each access, as with the Python panel)."""

    def __init__(
        self,
        capacity: int,
        experts: Sequence[str],
        *,
        seed: int = 0,
        sample: int = 1,
        min_miniature: int = MIN_MINIATURE,
        sketched: bool = False,
        sketch_seed: int = 0,
        owner_counts: bool = False,
        prior_recency: float = 0.5,
    ) -> None:
        unknown = [e for e in experts if e not in COMPILED_EXPERTS]
        if unknown or not experts:
            known = ", ".join(sorted(COMPILED_EXPERTS))
            raise ValueError(f"experts {unknown or '()'} are not compiled; compiled: {known}")
        self.names = list(experts)
        self.capacity = capacity
        self.digests: dict[int, int] = {}  # the owner's slots of resident keys that cross as digests
        self.sample = sample_rate(capacity, sample, min_miniature)
        self.core = Panel(
            capacity,
            self.names,
            seed=seed,
            sample=self.sample,
            horizons=list(HORIZONS),
            sigmas=list(SIGMAS),
            min_lead=MIN_LEAD,
            sketched=sketched,
            sketch_seed=sketch_seed,
            owner_counts=owner_counts,
            layout=LAYOUT,
            prior_recency=prior_recency,
        )
        # With `owner_counts` the owner's sketch is this one (`PanelSketch`), counted by the owner.
        self.sketch = PanelSketch(self.core, sketch_seed)

    @property
    def leader(self) -> int:
        return self.core.leader

    @property
    def leader_name(self) -> str:
        return self.names[self.core.leader]

    @property
    def contested(self) -> bool:
        return self.core.contested

    @property
    def switches(self) -> int:
        return self.core.switches

    @property
    def hits(self) -> list[int]:
        return self.core.hits

    def use_heat(self, heat: Callable[[np.ndarray], np.ndarray] | None) -> None:
        """The frame's heat from now on (None: the prior, computed in the core)."""
        self.core.set_heat(heat)

    def holds(self, key: Hashable) -> bool:
        return self.core.holds(key if type(key) is int and 0 <= key <= _M64 else key_digest(key))

    def access(self, key: Hashable, now_ms: int, chained: bool = False) -> list[int]:
        """One access; the ints of the keys the driver evicted (or rejected)."""
        return self.core.access(panel_key(key), chained)

    def admitted(self, key: Hashable, slot: int) -> None:
        """The owner holds `key` in `slot` (remembered for keys that cross as their digest)."""
        if not same_key(key):
            self.digests[panel_key(key)] = slot

    def released(self, key: Hashable) -> None:
        if self.digests and not same_key(key):
            self.digests.pop(panel_key(key), None)

    def access_slots(self, key: Hashable, chained: bool, slots: Mapping[Hashable, int]) -> list[int]:
        """One access; the owner's slots (`slots` by key, or as `admitted`) of the keys the driver
        evicted or rejected."""
        digests, out = self.digests, []
        pk = key if type(key) is int and 0 <= key <= _M64 else key_digest(key)
        for gone in self.core.access(pk, chained):
            s = digests.get(gone) if digests else None
            if s is None:
                s = slots.get(gone)
            if s is not None:
                out.append(s)
        return out

    def challengers(self) -> list[tuple[int, float]]:
        return self.core.challengers()

    def lead(self, i: int, j: int, horizon: int = 0) -> float:
        return self.core.lead(i, j, horizon)

    def missing(self, expert: int, resident: Iterable[Hashable]) -> float:
        keys = list(resident)
        try:  # ints in [0, 2**64) cross as they are
            return self.core.missing(expert, keys)  # type: ignore[arg-type]
        except (TypeError, OverflowError):
            return self.core.missing(expert, [panel_key(k) for k in keys])

    def follow(self, expert: int, resident: Iterable[Hashable] = (), now_ms: int = 0) -> None:
        self.core.follow(expert, [panel_key(k) for k in resident])

    def forget(self, key: Hashable) -> None:
        self.core.remove(panel_key(key))

    def holders(self, key: Hashable) -> list[int]:
        return self.core.holders(panel_key(key))

    def invalidate(self) -> None:
        self.core.invalidate()

    @property
    def native_bytes(self) -> int:
        return self.core.native_bytes


def heat_panel(
    capacity: int,
    experts: Sequence[str],
    *,
    compiled: bool,
    sketch: FrequencySketch,
    frame: SketchedFactory,
    seed: int,
    sample: int,
    min_miniature: int,
    prior_recency: float,
) -> ExpertPanel | CompiledPanel | None:
    """The heat policy's panel: compiled where asked and every expert is (the policy's sketch is then
    the panel's `sketch`, one, counted in the core), else the Python one (W-TinyLFU and the frame read
    the policy's `sketch`; `frame` builds a Python frame). None without experts."""
    if not experts:
        return None
    if compiled and set(experts) <= COMPILED_EXPERTS:
        return CompiledPanel(
            capacity,
            experts,
            seed=seed,
            sample=sample,
            min_miniature=min_miniature,
            sketched=True,
            sketch_seed=seed,
            owner_counts=True,
            prior_recency=prior_recency,
        )
    sketched: dict[str, SketchedFactory] = {
        "wtinylfu": lambda c, s: WTinyLFU(c, seed=seed, sketch=s),
        "heat-frame": frame,
    }
    return ExpertPanel(
        capacity,
        experts,
        sketched=sketched,
        sketch=sketch,
        seed=seed,
        sample=sample,
        min_miniature=min_miniature,
    )
