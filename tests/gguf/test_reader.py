"""Opening GGUF files and shard sets, and the one-line errors for files that cannot be used."""

from __future__ import annotations

import shutil

import gguf
import numpy as np
import pytest

from glm5_shim.gguf.errors import GGUFError
from glm5_shim.gguf.reader import open_gguf, shard_paths


def _one_line_error(exc_info, *fragments: str) -> str:
    message = str(exc_info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


def test_open_single_file(q8):
    model = open_gguf(q8.path)
    assert model.paths == [q8.path]
    assert model.architecture == "glm-dsa"
    assert model.metadata["glm-dsa.block_count"] == 4
    assert model.metadata["tokenizer.ggml.model"] == "gpt2"
    info = model.tensors["blk.1.ffn_down_exps.weight"]
    assert info.shard == 0 and info.path == q8.path
    assert info.shape == (8, 256, 256) and info.ne == (256, 256, 8)
    assert info.type_name == "Q8_0"
    assert info.n_bytes == 8 * 256 * 256 // 32 * 34
    assert info.data.dtype == np.uint8  # still the memory map, not decoded


def test_sharded_equals_single_file(tiny, gguf_dir):
    single = tiny("shard-ref", quant="Q4_K", seed=7)
    split = tiny("shard-3", quant="Q4_K", seed=7, shards=3)
    assert [p.name for p in split.paths] == [f"shard-3-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    one, three = open_gguf(single.path), open_gguf(split.path)
    assert len(three.paths) == 3
    assert sorted({t.shard for t in three}) == [0, 1, 2]
    assert list(one.tensors) == list(three.tensors)
    for name, info in one.tensors.items():
        other = three.tensors[name]
        assert (info.type_name, info.shape) == (other.type_name, other.shape)
        np.testing.assert_array_equal(np.asarray(info.data), np.asarray(other.data), err_msg=name)
    strip = lambda md: {k: v for k, v in md.items() if not k.startswith("split.")}  # noqa: E731
    assert strip(one.metadata) == strip(three.metadata)
    assert three.metadata["split.count"] == 3 and three.metadata["split.tensors.count"] == len(one.tensors)
    # Any shard finds the whole set.
    assert shard_paths(split.paths[2]) == split.paths
    assert list(open_gguf(split.paths[1]).tensors) == list(three.tensors)


def test_not_a_gguf(tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_text("this is a text file, not a model\n")
    with pytest.raises(GGUFError) as exc_info:
        open_gguf(path)
    _one_line_error(exc_info, str(path), "not a GGUF", "magic")


def test_missing_file(tmp_path):
    with pytest.raises(GGUFError) as exc_info:
        open_gguf(tmp_path / "absent.gguf")
    _one_line_error(exc_info, "absent.gguf", "not found")


def test_other_architecture(tmp_path):
    path = tmp_path / "llama.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GGUFError) as exc_info:
        open_gguf(path)
    _one_line_error(exc_info, str(path), "general.architecture", "'llama'", "'glm-dsa'")
    assert open_gguf(path, expected_architecture=None).architecture == "llama"


@pytest.mark.parametrize("keep_fraction", [0.6, 0.999])
def test_truncated_in_tensor_data(small, tmp_path, keep_fraction):
    source = small("good").path
    path = tmp_path / "cut.gguf"
    data = source.read_bytes()
    path.write_bytes(data[: int(len(data) * keep_fraction)])
    with pytest.raises(GGUFError) as exc_info:
        open_gguf(path)
    message = _one_line_error(exc_info, str(path), "truncated", "tensor ")
    assert str(path.stat().st_size) in message


def test_truncated_in_header(small, tmp_path):
    path = tmp_path / "header.gguf"
    path.write_bytes(small("good").path.read_bytes()[:5000])  # inside the token list
    with pytest.raises(GGUFError) as exc_info:
        open_gguf(path)
    _one_line_error(exc_info, str(path), "truncated", "tokenizer.ggml.tokens")


def test_missing_shard(small, tmp_path):
    split = small("split3", shards=3)
    for p in split.paths:
        shutil.copy(p, tmp_path / p.name)
    missing = tmp_path / split.paths[1].name
    missing.unlink()
    with pytest.raises(GGUFError) as exc_info:
        open_gguf(tmp_path / split.paths[0].name)
    _one_line_error(exc_info, str(tmp_path / split.paths[0].name), "missing shard 2 of 3", str(missing))


def test_shard_renamed_out_of_its_set(small, tmp_path):
    split = small("split3", shards=3)
    lonely = tmp_path / "lonely.gguf"
    shutil.copy(split.paths[0], lonely)
    with pytest.raises(GGUFError) as exc_info:
        open_gguf(lonely)
    _one_line_error(exc_info, str(lonely), "split.count", "3")
