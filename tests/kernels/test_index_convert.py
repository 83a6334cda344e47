
import pytest
import torch

from glm5_shim.kernels.index_convert import convert_to_global_slots, convert_to_global_slots_reference


@pytest.mark.parametrize("tokens,topk,block_size", [(1, 64, 64), (7, 200, 64), (33, 2048, 64), (5, 100, 16)])
def test_matches_reference(tokens, topk, block_size):
    g = torch.Generator().manual_seed(tokens * 1000 + topk)
    reqs, max_blocks = 3, 9
    block_table = torch.randperm(reqs * max_blocks * 4, generator=g)[: reqs * max_blocks].view(reqs, max_blocks)
    block_table = block_table.to(torch.int32)
    req = torch.randint(0, reqs, (tokens,), generator=g, dtype=torch.int32)
    pos = torch.randint(-3, max_blocks * block_size + 40, (tokens, topk), generator=g, dtype=torch.int32)
    pos[:, -5:] = -1  # invalid tail, as the indexer writes when a request has fewer tokens than top-k
    got = convert_to_global_slots(pos, req, block_table, block_size)
    ref = convert_to_global_slots_reference(pos, req, block_table, block_size)
    assert torch.equal(got, ref)
    assert (got[pos < 0] == -1).all() and (got[pos >= max_blocks * block_size] == -1).all()
    assert (got >= -1).all()
