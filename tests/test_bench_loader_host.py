"""bench/loader_host.py on a tiny GGUF: both ways of copying a rank's shard run and report, and the shard is the
rank's part along the dimension vLLM splits."""
import torch

from glm5_shim.gguf.fixture import make_tiny
from tests.helpers import bench_module

lh = bench_module("loader_host")


def test_shards_follow_vllms_split_dimension():
    t = torch.arange(2 * 4 * 8).reshape(2, 4, 8)
    assert torch.equal(lh.shard(t, "blk.1.ffn_up_exps.weight", 2, 1), t[:, 2:, :])  # rows
    assert torch.equal(lh.shard(t, "blk.1.ffn_down_exps.weight", 2, 1), t[:, :, 4:])  # bytes of a row
    assert torch.equal(lh.shard(t[0], "blk.0.attn_output.weight", 4, 3), t[0][:, 6:])


def test_both_ways_run_on_a_file(tmp_path, capsys):
    path = make_tiny(tmp_path / "t.gguf", quant="Q4_K", write_reference=False)[0]
    assert lh.main([str(path), "--tp", "2", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "| whole, then the shard (before) |" in out and "| the shard of a map view (now) |" in out
