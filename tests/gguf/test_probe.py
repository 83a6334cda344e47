"""The cheap architecture probe: reads only the first header entries and never raises."""
from glm5_shim.gguf.probe import gguf_architecture, is_gguf_file


def test_architecture_of_good_bad_and_cut_files(q8, tmp_path):
    assert gguf_architecture(q8.path) == "glm-dsa" and is_gguf_file(q8.path)
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"PK\x03\x04" + bytes(64))
    assert gguf_architecture(not_gguf) is None and not is_gguf_file(not_gguf)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(q8.path.read_bytes()[:40])  # header ends inside the first key
    assert gguf_architecture(cut) is None
    assert gguf_architecture(tmp_path / "missing.gguf") is None
    assert gguf_architecture(tmp_path) is None
