"""The vLLM connector's plan (client/cachemesh_client/kvplan.py): how many tokens the tiers supply beyond
vLLM's own prefix cache (whole blocks, never the prompt's last token), which paged blocks to load before
the forward pass, and which prompt blocks to save once they are in paged memory (never one the tiers
hold, each once, across chunked prefill and preemption)."""

from __future__ import annotations

from cachemesh_client.kvkeys import block_keys
from cachemesh_client.kvplan import BlockCopy, Planner

BS = 4


def planner() -> Planner:
    return Planner(model="m", block_size=BS)


def keys(n_tokens: int) -> list[str]:
    return block_keys(list(range(n_tokens)), model="m", block_size=BS)


def test_keys_are_the_shared_content_keys() -> None:
    assert planner().keys_of(list(range(10))) == keys(10)
    assert planner().keys_of(list(range(10)), "lora") != keys(10)


def test_the_tiers_supply_whole_blocks_after_vllms_own_and_never_the_last_token() -> None:
    p = planner()
    k = keys(16)  # a 16-token prompt: 4 full blocks
    assert p.matched("r", k, held=4, prompt_len=16, num_computed=0) == 3 * BS  # block 3 holds token 15
    assert p.matched("r", k, held=4, prompt_len=17, num_computed=0) == 4 * BS
    assert p.matched("r", k, held=4, prompt_len=17, num_computed=2 * BS) == 2 * BS  # vLLM had 2
    assert p.matched("r", k, held=1, prompt_len=17, num_computed=2 * BS) == 0
    assert p.matched("r", k, held=0, prompt_len=17, num_computed=0) == 0


def test_a_load_names_the_paged_blocks_after_the_local_ones_and_saves_the_rest() -> None:
    p = planner()
    k = keys(22)  # 5 full blocks, 2 tokens left over
    assert p.matched("r", k, held=3, prompt_len=22, num_computed=BS) == 2 * BS
    p.allocated("r", 2 * BS)
    plan = p.step([("r", [10, 11, 12, 13, 14, 15], BS * 3, 22 - BS * 3, False)])
    assert plan.loads == {"r": [BlockCopy(k[1], 1, 11), BlockCopy(k[2], 2, 12)]}
    # blocks 3 and 4 are computed in this step and saved; 0-2 are in the tiers already
    assert plan.saves == [BlockCopy(k[3], 3, 13), BlockCopy(k[4], 4, 14)]
    # decode steps add nothing to save (generated tokens are not saved)
    assert not p.step([("r", None, 22, 1, False)])
    p.finished("r")
    assert not p.requests


def test_chunked_prefill_saves_each_block_once_as_it_is_computed() -> None:
    p = planner()
    k = keys(40)  # 10 blocks
    assert p.matched("r", k, held=0, prompt_len=40, num_computed=0) == 0
    p.allocated("r", 0)
    first = p.step([("r", list(range(100, 106)), 0, 22, False)])  # 22 tokens: blocks 0-4 full
    second = p.step([("r", list(range(106, 110)), 22, 18, False)])
    assert not first.loads and [c.index for c in first.saves] == [0, 1, 2, 3, 4]
    assert [c.index for c in second.saves] == [5, 6, 7, 8, 9]
    assert [c.block_id for c in second.saves] == [105, 106, 107, 108, 109]


def test_blocks_vllm_had_but_the_tiers_lack_are_saved_from_its_memory() -> None:
    p = planner()
    k = keys(17)
    assert p.matched("r", k, held=1, prompt_len=17, num_computed=3 * BS) == 0  # vLLM has 3, tiers 1
    p.allocated("r", 0)
    plan = p.step([("r", [7, 8, 9, 10, 11], 3 * BS, 17 - 3 * BS, False)])
    assert [c.index for c in plan.saves] == [1, 2, 3]


def test_a_resumed_request_takes_its_new_blocks() -> None:
    p = planner()
    k = keys(12)
    p.matched("r", k, held=0, prompt_len=12, num_computed=0)
    p.allocated("r", 0)
    p.step([("r", [1, 2], 0, 8, False)])
    # preempted, then resumed: vLLM asks again and gives the whole new block list
    assert p.matched("r", k, held=2, prompt_len=12, num_computed=0) == 2 * BS
    p.allocated("r", 2 * BS)
    plan = p.step([("r", [5, 6, 7], 2 * BS, 4, True)])
    assert plan.loads == {"r": [BlockCopy(k[0], 0, 5), BlockCopy(k[1], 1, 6)]}
    assert plan.saves == [BlockCopy(k[2], 2, 7)]


def test_unknown_requests_are_ignored() -> None:
    assert not planner().step([("nobody", [1], 0, 4, False)])
