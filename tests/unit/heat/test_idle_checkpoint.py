"""The heat service saves its model only when it has trained since the last save or restore: an idle
service does not write (and log "model checkpointed") every interval."""

from __future__ import annotations

from typing import Any

from services.heat.service import HeatService
from services.heat.settings import HeatSettings


class MemoryModelStore:
    def __init__(self) -> None:
        self.saved: list[dict[str, Any]] = []

    async def save(self, name: str, blob: bytes, **kw: Any) -> int:
        self.saved.append({"name": name, **kw})
        return len(self.saved)

    async def latest(self, name: str) -> tuple[int, bytes] | None:
        return None


async def test_an_idle_model_is_not_checkpointed_again() -> None:
    service = HeatService(HeatSettings(capacity=16))
    store = MemoryModelStore()
    service._store = store  # type: ignore[assignment]
    scorer = service.engine.policy.scorer
    assert not service.model_changed(), "a fresh, untrained model has nothing to save"
    scorer.steps += 3
    assert service.model_changed()
    await service.checkpoint()
    assert len(store.saved) == 1 and store.saved[0]["metrics"]["steps"] == scorer.steps
    assert not service.model_changed(), "saved: nothing new until it trains again"
    scorer.labels_seen += 1
    assert service.model_changed()


async def test_chain_re_use_labels_count_as_news_to_save() -> None:
    service = HeatService(HeatSettings(capacity=16))
    service._store = MemoryModelStore()  # type: ignore[assignment]
    chain = service.engine.policy.chain_reuse
    assert chain is not None
    chain.heard("b", 32)  # watched (1 in 32) ...
    chain.heard("b", 40)  # ... and back within the horizon: one label
    assert chain.labels == 1 and service.model_changed()
    await service.checkpoint()
    assert not service.model_changed()
