"""Screened text lookups, a two-precision cascade: a lookup embedded by a cheap model (int8) searches and
is decided by that vector wherever its error cannot change the verdict; where a candidate lies within
`band` of its threshold, the request's text is embedded again by the precise model (the one entries
are written with) and every candidate is re-scored with that vector, so the verdict is the precise
model's. The band is the error bound: on the bench's 2,150 texts an int8 query against fp32 entries
moved a pair's cosine by -0.041 to +0.033 (mean -0.005, sd 0.007), hence 0.04 by default; a re-score
that moves a candidate further widens it (longer texts moved up to 0.045). The tiers return candidates
down to `band` below their floors, so none the precise model would serve is lost."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np

from services.tiers.node.plan import Offer

# (texts) -> unit-norm float32 rows of the precise model
Precise = Callable[[list[str]], Awaitable[np.ndarray]]
DEFAULT_BAND = 0.04
DEFAULT_MAX_BAND = 0.1
_WIDEN = 1.25


@dataclass
class Refiner:
    """The precise model's embed and the band; counts what it did (for stats)."""

    precise: Precise
    band: float = DEFAULT_BAND
    # A shift past the band widens it to 1.25x that shift, up to `max_band` (never narrows): the error
    # the screen showed on this traffic is what it may make outside the band too.
    max_band: float = DEFAULT_MAX_BAND
    screened: int = 0  # screened lookups decided
    refined: int = 0  # of those, re-scored by the precise model
    failed: int = 0  # re-scores the precise model could not do (decided on the screened vector)
    # The band's check on live traffic: how far re-scoring moved a candidate's similarity. A shift past
    # the band means a verdict outside it could have been wrong too: widen the band.
    max_shift: float = 0.0
    over_band: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.band < 1.0:
            raise ValueError(f"band must be in [0, 1), got {self.band}")
        if not self.band <= self.max_band < 1.0:
            raise ValueError(f"max_band must be in [band, 1), got {self.max_band}")
        self.configured_band = self.band

    def observe(self, before: Sequence[Offer], after: Sequence[Offer]) -> None:
        """Records how far re-scoring moved each candidate (once per entry: tiers may offer it twice)."""
        shifts = {n.entry.key: abs(n.similarity - o.similarity) for o, n in zip(before, after, strict=True)}
        for shift in shifts.values():
            self.max_shift = max(self.max_shift, shift)
            if shift > self.band:
                self.over_band += 1
                self.band = min(self.max_band, _WIDEN * shift)

    def stats(self) -> dict[str, float | int]:
        return {
            "band": self.band,
            "configured_band": self.configured_band,
            "screened": self.screened,
            "refined": self.refined,
            "failed": self.failed,
            "max_shift": round(self.max_shift, 6),
            "over_band": self.over_band,
        }


def unsettled(similarities: Sequence[float], thresholds: Sequence[float], band: float) -> bool:
    """Whether the screened vector may decide wrongly: a candidate within `band` of its threshold."""
    return any(abs(s - t) <= band for s, t in zip(similarities, thresholds, strict=True))


def rescore(offers: Sequence[Offer], query: np.ndarray) -> list[Offer]:
    """The offers with their similarity to `query` (unit norm); one whose entry has no stored embedding
    keeps its own."""
    out = []
    for offer in offers:
        stored = offer.entry.meta.embedding
        if stored is None:
            out.append(offer)
            continue
        vec = np.asarray(stored, dtype=np.float32).reshape(-1)
        norm = float(np.linalg.norm(vec))
        sim = float(vec @ query) / norm if norm > 0 else offer.similarity
        out.append(offer._replace(similarity=sim))
    return out
