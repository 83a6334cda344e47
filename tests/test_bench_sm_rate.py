"""bench/sm_rate.py: bytes an SM takes a clock, from the same sweep shapes on two GPUs."""
import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("sm_rate", pathlib.Path(__file__).parents[1] / "bench" / "sm_rate.py")
sm_rate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sm_rate)


def _doc(device, bw, us, cfg_ahead=2, stages=0):
    cfg = dict(num_warps=4, ctas_per_sm=4, ahead=cfg_ahead, l2_ahead=0, stages=stages)
    return dict(device=device, bandwidth=bw, rows=[
        dict(kind="sweep", what="mma moe tp8 Q4_K", T=32, cfg=cfg, us=us, floor_us=100.0),
        dict(kind="sweep", what="mma moe tp8 Q4_K", T=32, cfg=dict(cfg, ctas_per_sm=8), us=1.0, floor_us=100.0),
        dict(kind="sweep", what="mma moe tp8 Q4_K", T=32, cfg=dict(cfg, reps=2), us=1.0, floor_us=100.0)])


def test_a_memory_bound_kernel_takes_the_bandwidth_ratio_and_the_default_shape_is_the_one_read():
    # 400 MB a call: 200 µs on a 4 TB/s GPU, 400 µs on a 2 TB/s one (floor_us is bytes / that GPU's bandwidth)
    fast, slow = _doc("fast", 4e12, 200.0), _doc("slow", 2e12, 400.0)
    slow["rows"] = [dict(r, floor_us=200.0) for r in slow["rows"]]
    lines = sm_rate.table(fast, slow)
    assert len(lines) == 3, lines           # header, rule, one shape: the other launch shapes are not the default
    cells = [c.strip() for c in lines[2].split("|")[1:-1]]
    assert cells[:5] == ["mma moe tp8 Q4_K", "32", "200.0", "400.0", "2.00"]
    per_clock = 400e6 / 200e-6 / (sm_rate.SMS * sm_rate.CLOCK)
    assert cells[5] == f"{per_clock:.1f} / {per_clock / 2:.1f}"
    sms, clk, bw = sm_rate.GPUS["RTX PRO 6000"]
    need = bw / (sms * clk)
    assert cells[6 + list(sm_rate.GPUS).index("RTX PRO 6000")] == f"{need:.1f} / {min(1.0, per_clock / need):.0%}"


def test_a_sweep_of_another_default_shape_is_not_taken():
    # Q4_K's default takes AHEAD=2: a sweep recorded with AHEAD=1 is not its default shape, nor one with a ring
    assert len(sm_rate.table(_doc("a", 4e12, 200.0, cfg_ahead=1), _doc("b", 2e12, 400.0, cfg_ahead=1))) == 2
    assert len(sm_rate.table(_doc("a", 4e12, 200.0, stages=3), _doc("b", 2e12, 400.0, stages=3))) == 2


def test_the_type_comes_from_the_row_where_recorded_and_from_the_label_in_older_files():
    assert sm_rate.row_qtype(dict(what="mma moe tp8 Q6_K packed")) == "Q6_K"
    assert sm_rate.row_qtype(dict(what="mma moe tp8 Q2_K")) == "Q2_K"
    # a recorded type wins over whatever the label says (labels are prose; they may change)
    assert sm_rate.row_qtype(dict(what="mma moe tp8 Q4_K (ring)", qtype="Q4_K")) == "Q4_K"
    fast, slow = _doc("a", 4e12, 200.0), _doc("b", 2e12, 400.0)
    for d in (fast, slow):
        d["rows"] = [dict(r, what="decode experts Q4_K, relabelled", qtype="Q4_K") for r in d["rows"]]
    assert len(sm_rate.table(fast, slow, what_prefix="decode")) == 3
