"""bench/read_floor.py's readers (the measuring stick under the GGUF kernels' % of floor) in the interpreter: every
word they are meant to read is in their XOR checksums, and nothing else."""
import pytest
import torch

from tests.helpers import bench_module

rf = bench_module("read_floor")


def _xor(t: torch.Tensor) -> int:
    words = t.contiguous().reshape(-1).view(torch.int32)
    acc = 0
    for v in words.tolist():
        acc ^= v
    return acc


def test_read_experts_sums_each_distinct_expert_once():
    g = torch.Generator().manual_seed(3)
    w = torch.randint(0, 256, (6, 5, 3300), dtype=torch.uint8, generator=g)  # 4125 words an expert: 2 chunks
    ids = torch.tensor([[4, 1], [1, 4], [0, 4]], dtype=torch.int32)
    slots = rf.distinct_experts(ids, 6)
    assert slots.tolist() == [0, 1, 4, -1, -1, -1]
    out = rf.read_experts(w, slots)
    assert out.shape == (6, -(-w[0].numel() // 4 // rf.CHUNK_WORDS))
    for s, e in enumerate(slots.tolist()):
        assert _xor(out[s]) == (_xor(w[e]) if e >= 0 else 0), (s, e)


def test_read_weight_sums_every_word():
    g = torch.Generator().manual_seed(4)
    w = torch.randint(0, 256, (7, rf.CHUNK_WORDS + 36), dtype=torch.uint8, generator=g)
    out = rf.read_weight(w)
    assert out.numel() == -(-w.numel() // 4 // rf.CHUNK_WORDS)
    assert _xor(out) == _xor(w)


def test_rows_need_not_be_whole_words_where_an_expert_is():
    # IQ2_XXS: a row of 256 values is 66 bytes (the 2026-12-03 bench stopped here); an expert of 6 such rows is 99 words
    g = torch.Generator().manual_seed(5)
    w = torch.randint(0, 256, (3, 6, 66), dtype=torch.uint8, generator=g)
    out = rf.read_experts(w, torch.tensor([2, -1, 0], dtype=torch.int32))
    assert [_xor(out[s]) for s in range(3)] == [_xor(w[2]), 0, _xor(w[0])]
    assert _xor(rf.read_weight(w)) == _xor(w)


def test_parts_that_are_not_whole_words_are_refused():
    with pytest.raises(ValueError, match="the weight of 10 bytes is not a whole number of int32 words"):
        rf.read_weight(torch.zeros(2, 5, dtype=torch.uint8))
    with pytest.raises(ValueError, match="an expert of 10 bytes is not a whole number of int32 words"):
        rf.read_experts(torch.zeros(2, 2, 5, dtype=torch.uint8), torch.tensor([0, 1], dtype=torch.int32))
