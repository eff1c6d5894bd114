"""The L3 contract (tests/contract/l3_contract.py) against the in-memory fake the unit tests use, with and
without semantic search."""

from __future__ import annotations

import pytest

from tests.contract.l3_contract import DIM, ExactOnlyL3Contract, SemanticL3Contract
from tests.unit.tiers.fakes import MemoryL3


class TestMemoryL3(SemanticL3Contract):
    @pytest.fixture
    def store(self) -> MemoryL3:
        return MemoryL3(dim=DIM)


class TestMemoryL3WithoutSemanticSearch(ExactOnlyL3Contract):
    @pytest.fixture
    def store(self) -> MemoryL3:
        return MemoryL3(dim=DIM, semantic=False)
