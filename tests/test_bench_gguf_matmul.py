"""bench/gguf_matmul.py without a GPU: its report of the read floor (bench/read_floor.py) next to the shim's time."""
from tests.helpers import bench_module

gm_bench = bench_module("gguf_matmul")


def test_the_report_puts_each_rows_read_floor_beside_the_shims_time():
    moe = dict(kind="moe", tp=8, type="Q4_K", T=1, floor_us=5.0, tc_floor_us=0.01, shim_us=22.0, shim_pct_floor=22.7,
               read_us=11.0, read_pct_floor=45.5, shim_pct_read=50.0)
    dense = dict(kind="dense", layer="o_proj", N=6144, K=2048, type="Q4_K", T=1, floor_us=1.7, tc_floor_us=0.0,
                 shim_us=7.8, shim_pct_floor=21.8, read_us=3.4, read_pct_floor=50.0, shim_pct_read=43.6)
    text = gm_bench.markdown([moe, dense], 4.26e12, "H200")
    assert "## The read floor" in text
    assert "| MoE TP 8 | Q4_K | 1 | 5.0 | 11.0 | 46 | 22.0 | 50 |" in text
    assert "| o_proj [6144, 2048] | Q4_K | 1 | 1.7 | 3.4 | 50 | 7.8 | 44 |" in text
    assert "## The read floor" not in gm_bench.markdown([{k: v for k, v in moe.items() if "read" not in k}],
                                                         4.26e12, "H200")
