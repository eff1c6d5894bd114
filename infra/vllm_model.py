"""Builds a random-weight Llama-architecture model and a byte-level BPE tokenizer trained here, both
deterministic, into a directory `vllm serve` loads (no model hub). Run by vLLM's venv python:

    python infra/vllm_model.py OUT_DIR '{"name": ..., "hidden": 128, "layers": 2, ...}'

Standalone on purpose (transformers, tokenizers and torch come from vLLM's venv, not the project's).
Output text is noise; greedy output is deterministic, which is what tests need.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # one thread: the BPE merges come out the same each time

WORDS = (
    "the of and to in is it that for on was with as be by at this from or an are not but what all were "
    "when we there can more if no out so said about which their time will up other into has some could "
    "them than first been call who its now find long down day did get come made may part cache block "
    "prompt answer token model layer prefix engine query node tier heat warm cold stream event kafka "
    "store load save key value paris france capital river city water light music number seven twelve "
    "question why how where which world system memory vector semantic network server request reply"
).split()
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]


def corpus(seed: int, lines: int = 20_000) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 16))]
        if rng.random() < 0.3:
            words.append(str(rng.randint(0, 9999)))
        out.append(" ".join(words) + rng.choice([".", "?", "!", ","]))
    return out


def build_tokenizer(out: Path, vocab: int, seed: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        chat_template=CHAT_TEMPLATE,
    )
    fast.model_max_length = 1 << 20
    fast.save_pretrained(out)


def build_model(out: Path, shape: dict[str, int | str]) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(int(shape["seed"]))
    config = LlamaConfig(
        vocab_size=int(shape["vocab"]),
        hidden_size=int(shape["hidden"]),
        intermediate_size=int(shape["intermediate"]),
        num_hidden_layers=int(shape["layers"]),
        num_attention_heads=int(shape["heads"]),
        num_key_value_heads=int(shape["kv_heads"]),
        max_position_embeddings=int(shape["max_positions"]),
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)  # type: ignore[arg-type]
    model.save_pretrained(out, safe_serialization=True)


def main() -> None:
    out, shape = Path(sys.argv[1]), json.loads(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out, int(shape["vocab"]), int(shape["seed"]))
    build_model(out, shape)
    (out / "cachemesh-shape.json").write_text(json.dumps(shape, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
