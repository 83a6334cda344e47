"""The prompts: words drawn from the tokenizer's corpus, below index_topk and far above it, and one chat."""
from __future__ import annotations

import random
from functools import lru_cache

@lru_cache(maxsize=1)
def _corpus_words() -> list[str]:
    from glm5_shim.gguf._tiny_corpus import TINY_CORPUS

    return sorted({w for w in TINY_CORPUS.split() if w.isalpha()})


def words(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_corpus_words()) for _ in range(n))


@lru_cache(maxsize=1)
def prompts() -> dict[str, str]:
    """Below index_topk (128) and far above it, so that attention is dense for some and truly sparse for most."""
    return {"short": "Hello, my name is", "below_topk": words(40, 1), "sparse_600": words(450, 2),
            "sparse_1500": words(1100, 3), "sparse_3000": words(2200, 4)}


CHAT = [{"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": words(250, 5)}]
