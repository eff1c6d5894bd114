"""Generated prefix traffic with reuse unlike the dev Mooncake trace's: hot one-block prompts (Zipf),
conversations that grow a few blocks per turn, and one-off long documents read once."""

from __future__ import annotations

import random

from sim.traces import Trace, from_requests


def mixed_prefix_trace(
    seed: int,
    requests: int = 6000,
    *,
    single_share: float = 0.5,
    conversation_share: float = 0.3,
    hot_prompts: int = 300,
    zipf: float = 1.1,
    conversations: int = 400,
    document_blocks: int = 40,
) -> Trace:
    """`single_share` of the requests are one hot prompt's block, `conversation_share` a conversation's
    next turn (1-4 new blocks on its history, restarted past 60 blocks), the rest a new document."""
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) ** zipf for i in range(hot_prompts)]
    history: list[list[int]] = [[] for _ in range(conversations)]
    next_key = hot_prompts + 1
    out: list[list[int]] = []
    for _ in range(requests):
        u = rng.random()
        if u < single_share:
            out.append([rng.choices(range(1, hot_prompts + 1), weights)[0]])
        elif u < single_share + conversation_share:
            c = rng.randrange(conversations)
            grown = rng.randint(1, 4)
            history[c] = history[c] + list(range(next_key, next_key + grown))
            next_key += grown
            if len(history[c]) > 60:
                history[c] = []
            else:
                out.append(list(history[c]))
        else:
            out.append(list(range(next_key, next_key + document_blocks)))
            next_key += document_blocks
    return from_requests(f"mixed-{seed}-{single_share:g}", out)
