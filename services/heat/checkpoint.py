"""The heat model as bytes and back: weights, optimiser state and training counters, the prefix chains'
learned re-use counts (`chains.ChainReuse`) and the LRFU half-life the chain guard moved to, so a
restarted heat service keeps what it learned. Pure: the Postgres adapter stores the bytes. A checkpoint
without chain counts or a half-life (written before they existed) restores the MLP and leaves the rest
as it is."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import torch

from policies.learned.chains import ChainReuse
from policies.learned.scorer import HeatScorer

FORMAT = 1


@dataclass(frozen=True, slots=True)
class Checkpoint:
    blob: bytes
    steps: int
    labels_seen: int


def dump_scorer(
    scorer: HeatScorer, chain: ChainReuse | None = None, half_life: float | None = None
) -> Checkpoint:
    state: dict[str, object] = {
        "format": FORMAT,
        "n_features": scorer.n_features,
        "model": scorer.model.state_dict(),
        "optimizer": scorer.optimizer.state_dict(),
        "steps": scorer.steps,
        "labels_seen": scorer.labels_seen,
    }
    if chain is not None:
        state["chain_reuse"] = chain.to_dict()
    if half_life is not None:
        state["chain_half_life"] = float(half_life)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return Checkpoint(buffer.getvalue(), scorer.steps, scorer.labels_seen)


def load_scorer(scorer: HeatScorer, blob: bytes, chain: ChainReuse | None = None) -> float | None:
    """Restores `scorer` (and `chain`, where the checkpoint has its counts) in place; returns the
    chain half-life the checkpoint holds (None if none), for the policy to start from. Refuses a
    checkpoint of another shape rather than half-loading it."""
    state = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    if state.get("format") != FORMAT or state.get("n_features") != scorer.n_features:
        raise ValueError(
            f"checkpoint format {state.get('format')} / {state.get('n_features')} features does not fit "
            f"this model (format {FORMAT} / {scorer.n_features} features)"
        )
    half_life = state.get("chain_half_life")
    positive = isinstance(half_life, float) and math.isfinite(half_life) and half_life > 0
    if half_life is not None and not positive:
        raise ValueError(f"a chain half-life must be a positive number of capacities, not {half_life!r}")
    counts = state.get("chain_reuse")
    if chain is not None and counts is not None:
        chain.load(counts)  # checked before the MLP is touched: a bad checkpoint changes nothing
    scorer.model.load_state_dict(state["model"])
    scorer.optimizer.load_state_dict(state["optimizer"])
    scorer.steps = int(state["steps"])
    scorer.labels_seen = int(state["labels_seen"])
    scorer.refresh()
    return half_life
