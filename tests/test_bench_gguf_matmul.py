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


def test_the_sweep_table_sorts_each_shape_by_time_and_shows_its_difference_from_the_default():
    cfg = lambda w, r, c: dict(num_warps=w, reps=r, ctas_per_sm=c)  # noqa: E731
    rows = [dict(kind="sweep", what="mma moe tp8 Q4_K", T=1, cfg=cfg(4, 2, 4), us=23.0, floor_us=5.0,
                 rel_diff_vs_default=0.0),
            dict(kind="sweep", what="mma moe tp8 Q4_K", T=1, cfg=cfg(8, 1, 8), us=15.0, floor_us=5.0,
                 rel_diff_vs_default=2.5e-4),
            dict(kind="sweep", what="mma moe tp8 Q4_K", T=1, cfg=cfg(2, 4, 2), us=None, floor_us=5.0)]
    text = gm_bench.markdown(rows, 4.26e12, "H200")
    lines = [ln for ln in text.splitlines() if ln.startswith("| mma moe tp8 Q4_K")]
    assert len(lines) == 3
    assert lines[0].endswith("| 15.0 | 33 | 2.5e-04 |") and "'ctas_per_sm': 8" in lines[0]
    assert lines[1].endswith("| 23.0 | 22 | 0.0e+00 |")
    assert lines[2].endswith("| — | — | — |")   # failed to compile or launch: no time, no comparison


def test_the_prefill_table_names_each_dequantizing_and_prefill_tile_arm_and_its_shape(monkeypatch):
    monkeypatch.setattr(gm_bench, "DEQUANT_TUNINGS", [{}, {"dequantize": {"steps": 16}}])
    monkeypatch.setattr(gm_bench, "PREFILL_TUNINGS", [{"BLOCK_M": 128, "num_warps": 8}])
    row = dict(kind="moe", tp=8, type="Q4_K", T=8192, floor_us=155.0, tc_floor_us=600.0, shim_us=3430.0,
               shim_pct_floor=4.5, prefill_tiles_us=4315.0,
               dequant_us=3430.0, dequant1_us=2600.0, prefill_tiles1_us=3000.0, vllm_bf16_us=2100.0,
               dequant_rel_vs_shim=0.0, dequant1_rel_vs_shim=0.0, prefill_tiles_rel_vs_shim=0.002,
               prefill_tiles1_rel_vs_shim=0.003)
    text = gm_bench.markdown([row], 4.26e12, "H200")
    assert "dequant: default, dequant1: {'dequantize': {'steps': 16}}, prefill_tiles1: {'BLOCK_M': 128" in text
    want = "| 8 | Q4_K | 8192 | **3430.0** | 4315.0 | — | — | — | 3430.0 | 2600.0 | 3000.0 | 2100.0 | 155.0 | 0.0030 |"
    assert want in text


def test_a_dequantizing_arm_passes_its_dequantize_shape_to_the_plan_and_the_rest_to_the_tiles():
    plan = gm_bench.dequant_plan(8192, {"BLOCK_M": 64, "dequantize": {"steps": 16, "BLOCK_N": 64}})
    assert plan["dequant"] and plan["dequant_tuning"] == {"BLOCK_M": 64}
    assert plan["dequantize_tuning"] == {"steps": 16, "BLOCK_N": 64}
    assert gm_bench.dequant_plan(8192, {})["dequantize_tuning"] is None


def test_the_dense_sweeps_wide_tiles_are_tile_plans_of_their_own_shape():
    """Each DENSE_WIDE_TILES entry, passed as a tuning at 33-256 rows, gives the tile plan it names (not the
    dequantizing path the plan takes by default above DENSE_DEQUANT_MIN_M rows), K split only up to 64 rows."""
    from glm5_shim.kernels.gguf import tiles as gm

    assert gm.linear_plan(256, 19360, 6144, 132)["dequant"]
    for cfg in gm_bench.DENSE_WIDE_TILES:
        for m in (64, 128, 256):
            plan = gm.linear_plan(m, 19360, 6144, 132, tuning=cfg)
            assert not plan["dequant"], (cfg, m)
            assert {k: plan[k] for k in cfg} == cfg, (cfg, m, plan)
            assert plan["split"] == 1 or m <= 64, (cfg, m, plan)
