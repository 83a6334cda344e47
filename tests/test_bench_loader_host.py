"""bench/loader_host.py on a tiny GGUF: both ways of copying a rank's shard run and report, and the shard is the
rank's part along the dimension vLLM splits."""
import torch

from glm5_shim.gguf.fixture import make_tiny
from tests.helpers import bench_module

lh = bench_module("loader_host")


def test_shards_follow_vllms_split_dimension():
    t = torch.arange(2 * 4 * 8).reshape(2, 4, 8)
    assert torch.equal(lh.shard(t, lh.TP_COLUMN, 2, 1), t[:, 2:, :])  # rows
    assert torch.equal(lh.shard(t, lh.TP_ROW, 2, 1), t[:, :, 4:])  # bytes of a row
    assert torch.equal(lh.shard(t[0], lh.TP_ROW, 4, 3), t[0][:, 6:])
    assert lh.shard(t, "replicated", 8, 3) is t


def test_the_tensors_timed_are_the_loaders_and_split_as_its_table_says(tmp_path):
    path = make_tiny(tmp_path / "t.gguf", quant="Q4_K", write_reference=False)[0]
    splits = {info.name: split for info, split in lh.kept(str(path))}
    assert splits["blk.1.ffn_down_exps.weight"] == lh.TP_ROW and splits["blk.0.attn_output.weight"] == lh.TP_ROW
    assert splits["blk.1.ffn_gate_exps.weight"] == lh.TP_COLUMN
    assert not any(n.endswith(("attn_k_b.weight", "norm.weight")) for n in splits)  # rebuilt or float: not kept


def test_both_ways_run_on_a_file(tmp_path, capsys):
    path = make_tiny(tmp_path / "t.gguf", quant="Q4_K", write_reference=False)[0]
    assert lh.main([str(path), "--tp", "2", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "| whole, then the shard (before) |" in out and "| the shard of a map view (now) |" in out
