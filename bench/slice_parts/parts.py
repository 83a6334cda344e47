"""The parts of `bench/slice_serve.py run`, in priority order, and the run itself: make the slices on the device,
start one `vllm serve` per part through launch.sh (e2e_parts.servers; reused by the next part when it asks for the
same server), measure, write DIR/slice.json and DIR/slice.md after every step."""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from e2e_parts.arms import Arm
from e2e_parts.run import gpu_name, used_mib
from e2e_parts.servers import free_port_from, start, stop, wait_ready
from e2e_parts.throughput import ordinary_vocab
from e2e_parts.vllm_log import kept_lines, startup_numbers

from . import measure
from .hostmem import PeakRss
from .report import report
from .weights import plan_groups

LAYERS, DENSE_LAYERS = 4, 1  # 1 dense + 3 MoE: GLM-5's layer kinds, each timed on its own in the profile
SLICES = {"r8-Q4_K_M": ("Q4_K_M", 8), "r8-IQ2_M": ("UD-IQ2_M-like", 8), "full-Q4_K_M": ("Q4_K_M", 1)}
# Full depth: GLM-5's 78 layers (3 dense) + the MTP block, one rank of TP 8, peaked (MTP drafts are accepted), written
# with --shared-data (a 2.7 / 1.1 GB file that loads as the 58.4 / 29.2 GB rank: every layer its own GPU tensors)
FULL_DEPTH = {"layers": 78, "dense_layers": 3, "mtp": True, "peaked": True, "shared_data": True}
FULL_DEPTH_SLICES = {"r8-Q4_K_M-78L": ("Q4_K_M", 8), "r8-IQ2_M-78L": ("UD-IQ2_M-like", 8)}


def slice_shape(name: str) -> dict:
    """make-slice's arguments for a slice name (SLICES: 4 layers; FULL_DEPTH_SLICES: 78 + MTP, shared data)."""
    if name in FULL_DEPTH_SLICES:
        preset, rank_of = FULL_DEPTH_SLICES[name]
        return {"preset": preset, "rank_of": rank_of, **FULL_DEPTH}
    preset, rank_of = SLICES[name]
    return {"preset": preset, "rank_of": rank_of, "layers": LAYERS, "dense_layers": DENSE_LAYERS}


def slice_plan(name: str):
    from glm5_shim.gguf.slice.plan import plan_slice

    shape = dict(slice_shape(name))
    return plan_slice(shape.pop("layers"), shape.pop("dense_layers"), shape.pop("preset"), **shape)
# the serving limits (one server at a time, alone on the GPU)
MAX_MODEL_LEN = 18432  # a 16k prompt + up to 2k generated
FULL_DEPTH_MODEL_LEN = 34816  # a 32k prompt + up to 2k generated
GPU_MEMORY_UTILIZATION = 0.90
MAX_NUM_BATCHED_TOKENS = 8192  # the prefill chunk (and the prefill profile's prompt)
MAX_NUM_SEQS = 64  # e2e_parts.servers.start's, = the highest concurrency measured
OUT_LEN = 256  # decode tokens a stream
PROFILE_DECODE_S = 1.5  # a profiled decode window (~200-300 steps of the 4-layer slice)
PROFILE_MAX_TOKENS = 4096  # the profiled streams' length: they are cancelled when the window closes


@dataclass
class Part:
    key: str
    title: str
    slice: str
    path: str  # shim | native
    steps: tuple[str, ...]
    kernels: str = "shim"  # shim | vllm (GLM5_SHIM_GGUF_KERNELS)
    decode: str = "mma"  # mma | tile (GLM5_SHIM_GGUF_DECODE)
    splits: str = "kernel"  # kernel | launch (GLM5_SHIM_GGUF_SPLITS)
    concurrency: tuple[int, ...] = (1, 8, 32, 64)
    in_len: int = 2048
    est_s: int = 180  # expected wall time with a fresh server (start-up included), for --budget-s
    max_model_len: int = 0  # 0: MAX_MODEL_LEN
    profile_concurrency: tuple[int, ...] = ()  # () : --profile-concurrency
    profile_decode_s: float = 0.0  # 0: PROFILE_DECODE_S
    prefill_requests: int = 0  # 0: 4-32 by prompt length
    spec_k: int = 0  # MTP draft tokens a step (--speculative-config method mtp); 0: none

    @property
    def server_key(self) -> tuple:
        return (self.slice, self.path, self.kernels, self.decode, self.splits, self.max_model_len, self.spec_k)

    @property
    def model_len(self) -> int:
        return self.max_model_len or MAX_MODEL_LEN

    @property
    def env(self) -> dict:
        """The switches this part sets beyond the arm's (defaults are left unset)."""
        return ({} if self.decode == "mma" else {"GLM5_SHIM_GGUF_DECODE": self.decode}) | (
            {} if self.splits == "kernel" else {"GLM5_SHIM_GGUF_SPLITS": self.splits})


PARTS = {p.key: p for p in (
    Part("a", "rank-of-8 Q4_K_M, shim arm, GGUF kernels on", "r8-Q4_K_M", "shim",
         ("startup", "decode", "prefill", "logprobs", "profile"), est_s=240),
    Part("b", "rank-of-8 Q4_K_M, native arm (FlashMLA sparse + DeepGEMM)", "r8-Q4_K_M", "native",
         ("startup", "logprobs", "decode", "prefill", "profile"), est_s=200),
    Part("c", "rank-of-8 Q4_K_M, shim arm, GGUF kernels off (GLM5_SHIM_GGUF_KERNELS=vllm)", "r8-Q4_K_M", "shim",
         ("startup", "decode", "prefill", "profile"), kernels="vllm", concurrency=(1, 32), est_s=180),
    Part("d", "rank-of-8 Q4_K_M, shim arm, 16k-token prompts", "r8-Q4_K_M", "shim", ("startup", "decode", "prefill"),
         in_len=16384, est_s=200),
    Part("e", "rank-of-8 UD-IQ2_M-like, shim arm", "r8-IQ2_M", "shim", ("startup", "decode", "prefill", "profile"),
         concurrency=(1, 32), est_s=180),
    Part("f", "full-width Q4_K_M at TP 1, shim arm", "full-Q4_K_M", "shim",
         ("startup", "decode", "prefill", "profile"), est_s=300),
    # the decode kernels A/B in one run: the tile kernels, then the register-MMA kernels (the default) again
    Part("g", "rank-of-8 Q4_K_M, shim arm, tile decode (GLM5_SHIM_GGUF_DECODE=tile)", "r8-Q4_K_M", "shim",
         ("startup", "decode"), decode="tile", concurrency=(1, 32), est_s=120),
    Part("h", "rank-of-8 Q4_K_M, shim arm, register-MMA decode (the default)", "r8-Q4_K_M", "shim",
         ("startup", "decode"), concurrency=(1, 32), est_s=120),
    # the split sums A/B against a or h on one machine: separate reduction launches (the 2026-12-02 MoE and linears)
    Part("i", "rank-of-8 Q4_K_M, shim arm, split sums by launch (GLM5_SHIM_GGUF_SPLITS=launch)", "r8-Q4_K_M", "shim",
         ("startup", "decode", "profile"), splits="launch", concurrency=(1, 32), est_s=170),
    # full depth (issue #47): one server (32k prompts fit) for the 2k and the 32k parts; profiles of a few steps
    # (a full-depth step launches thousands of kernels: the trace of 0.4 s is ~100k events)
    Part("F", "full depth (78 layers + MTP block), rank-of-8 Q4_K_M, shim arm, 2k prompts", "r8-Q4_K_M-78L", "shim",
         ("startup", "decode", "profile", "prefill"), concurrency=(1, 2, 4, 8, 32), est_s=420,
         max_model_len=FULL_DEPTH_MODEL_LEN, profile_concurrency=(1, 8), profile_decode_s=0.4, prefill_requests=8),
    Part("F32k", "full depth, rank-of-8 Q4_K_M, shim arm, 32k prompts", "r8-Q4_K_M-78L", "shim",
         ("startup", "decode", "prefill"), concurrency=(1, 2, 4, 8), in_len=32768, est_s=240,
         max_model_len=FULL_DEPTH_MODEL_LEN, prefill_requests=2),
    Part("FI", "full depth, rank-of-8 UD-IQ2_M-like, shim arm, 2k prompts", "r8-IQ2_M-78L", "shim",
         ("startup", "decode", "profile"), concurrency=(1, 8, 32), est_s=360, max_model_len=FULL_DEPTH_MODEL_LEN,
         profile_concurrency=(1,), profile_decode_s=0.4),
    # MTP on the peaked full-depth rank (its MTP layer drafts the trunk's greedy tokens): acceptance from vLLM's
    # spec-decode counters over each decode wave
    *(Part(f"FM{k}", f"full depth, rank-of-8 Q4_K_M, shim arm, MTP K={k}", "r8-Q4_K_M-78L", "shim",
           ("startup", "decode"), concurrency=(1, 8), est_s=360, max_model_len=FULL_DEPTH_MODEL_LEN, spec_k=k)
      for k in (1, 3)),
)}


@dataclass
class SliceArm(Arm):
    """An arm whose environment also sets GLM5_SHIM_GGUF_KERNELS."""
    kernels: str = "shim"
    extra_env: dict = field(default_factory=dict)
    server_key: tuple = ()
    trace_dir: Path | None = None

    def env(self) -> dict[str, str]:
        env = super().env()
        if self.kernels != "shim":
            env["GLM5_SHIM_GGUF_KERNELS"] = self.kernels
        env.update(self.extra_env)
        return env


def serve_flags(trace_dir: Path, max_model_len: int = MAX_MODEL_LEN) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(limits, extra) for e2e_parts.servers.start: one server alone on the GPU, CUDA graphs on (vLLM's default),
    no prefix caching (random prompts are computed, warm-ups do not pre-fill the timed requests), the torch profiler
    armed (it records only between /start_profile and /stop_profile)."""
    limits = ("--max-model-len", str(max_model_len), "--gpu-memory-utilization", str(GPU_MEMORY_UTILIZATION))
    extra = ("--max-num-batched-tokens", str(MAX_NUM_BATCHED_TOKENS), "--no-enable-prefix-caching",
             *profiler_flags(trace_dir))
    return limits, extra


def profiler_flags(trace_dir: Path) -> tuple[str, str]:
    """`vllm serve` arguments arming the torch profiler (it records only between /start_profile and /stop_profile;
    gzipped traces land in trace_dir)."""
    profiler = {"profiler": "torch", "torch_profiler_dir": str(trace_dir.resolve()), "torch_profiler_with_stack": False,
                "torch_profiler_record_shapes": False, "ignore_frontend": True,
                "torch_profiler_dump_cuda_time_total": False, "torch_profiler_use_gzip": True}
    return "--profiler-config", json.dumps(profiler)


SLICE_DISK_SPARE = 2 << 30  # bytes left free on --slice-dir's disk after a slice (logs, traces, vLLM's caches)


def same_slice(mine: dict, ref: dict) -> tuple[bool, str]:
    """Whether two runs' slice records are the same model: by tensor digest where both have one (2026-12-03 on),
    else by tensor and file bytes (a metadata key changes the file bytes: such a pair is refused here and can be
    compared with `slice_serve.py logprobs` after checking the tensors)."""
    if mine.get("tensor_sha256") and ref.get("tensor_sha256"):
        theirs, ours = ref["tensor_sha256"][:12], mine["tensor_sha256"][:12]
        return theirs == ours, f"tensor digest {theirs}{' equal' if theirs == ours else ' vs ' + ours}"
    same = all(mine.get(k) is not None and mine.get(k) == ref.get(k) for k in ("bytes", "file_bytes"))
    return same, f"file bytes {ref.get('file_bytes')}{' equal' if same else ' vs ' + str(mine.get('file_bytes'))}"


def tensor_digest(path: Path) -> str:
    """sha256 of a GGUF's tensors (names, types, shapes, offsets, then every data byte), not its metadata: two
    slices with the same digest compute the same model whatever keys make-slice adds (2026-12-03: a metadata key
    added in 2026-12-03 made the file 32 bytes longer and the byte-count check refused an identical slice)."""
    import hashlib

    import gguf

    reader = gguf.GGUFReader(path)
    infos = [(t.name, t.tensor_type.name, [int(d) for d in t.shape], int(t.data_offset) - reader.data_offset)
             for t in reader.tensors]
    h = hashlib.sha256(json.dumps(infos).encode())
    with open(path, "rb") as f:
        f.seek(reader.data_offset)
        while chunk := f.read(64 << 20):
            h.update(chunk)
    return h.hexdigest()


def make_slice_file(name: str, slice_dir: Path) -> dict:
    """Write the slice (make-slice's library call) unless it is there; its bytes by group. The file is written under
    a temporary name and renamed when complete, so a file of that name is a whole slice (a run killed mid-write
    leaves only the temporary file, which the next run overwrites)."""
    import shutil

    from glm5_shim.gguf.slice.writer import slice_info, write_plan

    shape = slice_shape(name)
    path = slice_dir / f"{name}.gguf"
    plan = slice_plan(name)
    info = {"name": name, **shape,
            "bytes_by_group": plan_groups(shape["layers"], shape["dense_layers"], shape["preset"], shape["rank_of"])}
    if plan.shared_data:
        info["file_data_bytes"] = plan.file_data_nbytes
        info["distinct_layers"] = plan.distinct_layers
    if path.is_file() and path.stat().st_size >= plan.file_data_nbytes:
        info.update(path=str(path), bytes=plan.nbytes, reused=True, file_bytes=path.stat().st_size,
                    tensor_sha256=tensor_digest(path))
        return info
    slice_dir.mkdir(parents=True, exist_ok=True)
    partial = slice_dir / f"{name}.partial.gguf"
    partial.unlink(missing_ok=True)
    free = shutil.disk_usage(slice_dir).free
    if free < plan.file_data_nbytes + SLICE_DISK_SPARE:
        raise RuntimeError(f"slice {name}: {plan.file_data_nbytes / 1e9:.1f} GB to write, {free / 1e9:.1f} GB free on "
                           f"{slice_dir} (and {SLICE_DISK_SPARE / 2**30:.0f} GiB kept spare)")
    result = slice_info(write_plan(partial, plan, seed=0))
    os.replace(partial, path)
    info.update(result, bytes=plan.nbytes, path=str(path), file_bytes=path.stat().st_size,
                tensor_sha256=tensor_digest(path))
    return info


class Runner:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.slice_dir = Path(args.slice_dir)
        self.t0 = time.time()
        path = self.out / "slice.json"
        self.results = json.loads(path.read_text()) if path.is_file() and args.resume else {}
        self.results.update(date=time.strftime("%Y-%m-%d %H:%M"), command=" ".join(sys.argv), gpu=gpu_name(),
                            serve={"max_model_len": MAX_MODEL_LEN, "gpu_memory_utilization": GPU_MEMORY_UTILIZATION,
                                   "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS, "max_num_seqs": MAX_NUM_SEQS,
                                   "out_len": OUT_LEN, "kv_cache_dtype": "auto", "cuda_graphs": "vLLM default",
                                   "prefix_caching": False})
        self.results.setdefault("slices", {})
        self.results.setdefault("parts", {})
        self.arm: SliceArm | None = None
        self.rss: PeakRss | None = None
        self.vocab: list[int] = []
        self.servers_started = 0  # each server takes the next port (an old one may linger in TIME_WAIT)

    def elapsed(self) -> float:
        return time.time() - self.t0

    def logprob_reference(self) -> tuple[list | None, str]:
        """Part a's first-token log-probabilities to compare part b's with: this run's, else those of the slice.json
        named by --logprobs-ref when its r8-Q4_K_M slice is this run's (same bytes: make-slice is deterministic for
        its arguments and seed). (None, why not) otherwise."""
        a = self.results["parts"].get("a", {})
        if a.get("logprobs"):
            return a["logprobs"], "part a of this run"
        ref = getattr(self.args, "logprobs_ref", "") or ""
        if not ref:
            return None, "part a did not run (no --logprobs-ref)"
        try:
            other = json.loads(Path(ref).read_text())
            ref_lp = other["parts"]["a"]["logprobs"]
            ref_slice = other["slices"][PARTS["a"].slice]
        except (OSError, ValueError, KeyError) as exc:
            return None, f"part a did not run, and {ref} has no part-a log-probabilities ({exc!r})"
        same, why = same_slice(self.results["slices"].get(PARTS["a"].slice, {}), ref_slice)
        if not same:
            return None, f"part a did not run, and {ref}'s slice is not this run's ({why})"
        return ref_lp, f"part a of {ref} ({other.get('date', '?')}; {why})"

    def save(self) -> None:
        b = self.results["parts"].get("b", {})
        if b.get("logprobs"):
            ref, source = self.logprob_reference()
            agreement = measure.compare_logprobs(ref, b["logprobs"]) if ref else {"error": source}
            self.results["logprob_agreement"] = dict(agreement, reference=source)
        # each file written whole or not at all (a SIGTERM from `timeout` may land here); slice.json first, and
        # whatever the report makes of it
        self._write("slice.json", json.dumps(self.results, indent=1))
        try:
            text = report(self.results)
        except Exception as exc:  # noqa: BLE001 - the JSON holds the numbers; `slice_serve.py report` can redo this
            text = f"# report failed: {exc!r}\n"
        self._write("slice.md", text)

    def _write(self, name: str, text: str) -> None:
        tmp = self.out / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.out / name)

    def log(self, msg: str) -> None:
        print(f"[slice] {self.elapsed():6.0f} s  {msg}", flush=True)

    # -- servers ------------------------------------------------------------------------------------------------
    def server(self, part: Part, res: dict) -> SliceArm:
        if self.arm is not None and self.arm.server_key == part.server_key and self.arm.proc.poll() is None:
            res["server"] = f"reused {self.arm.name}"
            return self.arm
        self.stop_server()
        made = self.results["slices"].get(part.slice)
        if made is None or not Path(made.get("path", "")).is_file():  # (--resume on a fresh machine: made again)
            t = time.time()
            self.results["slices"][part.slice] = make_slice_file(part.slice, self.slice_dir)
            self.results["slices"][part.slice]["make_wall_s"] = round(time.time() - t, 1)
            self.log(f"slice {part.slice}: {self.results['slices'][part.slice]}")
            self.save()
        trace_dir = self.out / "traces" / part.key
        trace_dir.mkdir(parents=True, exist_ok=True)
        arm = SliceArm(f"{part.key}-{part.slice}-{part.path}" + ("-kernels-off" if part.kernels != "shim" else ""),
                       part.slice, "auto", part.path, port=free_port_from(self.args.base_port + self.servers_started),
                       kernels=part.kernels, server_key=part.server_key, trace_dir=trace_dir,
                       extra_env=part.env)
        limits, extra = serve_flags(trace_dir, part.model_len)
        if part.spec_k:
            from mtp import speculative_config

            extra = (*extra, "--speculative-config", speculative_config(part.spec_k))
        self.servers_started += 1
        start(arm, {part.slice: self.results["slices"][part.slice]["path"]}, self.out, 1, extra=extra, limits=limits)
        self.arm, self.rss = arm, PeakRss(arm.proc.pid)
        timeout = self.args.start_timeout
        if self.args.budget_s:  # a server that is not up in time is this part's error, not the run's timeout
            timeout = max(30.0, min(timeout, self.args.budget_s - self.elapsed()))
        try:
            wait_ready(arm, timeout)
        except RuntimeError:
            self.startup_record(arm, res, ok=False)
            raise
        self.startup_record(arm, res, ok=True)
        self.vocab = ordinary_vocab(arm)
        return arm

    def startup_record(self, arm: SliceArm, res: dict, ok: bool) -> None:
        text = arm.log.read_text(errors="replace") if arm.log and arm.log.exists() else ""
        nums = startup_numbers(text)
        info = self.results["slices"][arm.quant]
        if nums.get("load_s"):
            nums["load_gb_s"] = round(info["bytes"] / 1e9 / nums["load_s"], 2)
        if nums.get("weights_gib") and info.get("bytes"):
            # the GPU holds every layer's own tensors (a --shared-data file is a fraction of this): about 1 here
            nums["weights_over_tensor_bytes"] = round(nums["weights_gib"] * 2**30 / info["bytes"], 3)
        used = used_mib() if ok else None
        if used is not None:
            nums["gpu_used_gib"] = round(used / 1024, 2)
            known = sum(nums.get(k, 0.0) for k in ("weights_gib", "available_kv_gib", "graphs_gib"))
            nums["gpu_other_gib"] = round(nums["gpu_used_gib"] - known, 2)  # CUDA context, activations, workspaces
        nums["host_rss_peak_gib_startup"] = round(self.rss.peak / 2**30, 2) if self.rss else None
        res["startup"] = dict(ok=ok, startup_s=arm.startup_s if ok else None, env={k: v for k, v in arm.env().items()
                                                                              if k.startswith("GLM5_SHIM_")},
                              **nums, lines=kept_lines(text, 24))

    def stop_server(self) -> None:
        if self.arm is not None:
            stop(self.arm)
            if self.rss:
                self.rss.stop()
            self.arm = self.rss = None

    # -- parts --------------------------------------------------------------------------------------------------
    def run(self) -> int:
        keys = [k.strip() for k in self.args.parts.split(",") if k.strip()]
        try:
            for key in keys:
                part = PARTS[key]
                res = self.results["parts"].setdefault(key, {})
                res.update(title=part.title, slice=part.slice, path=part.path, kernels=part.kernels)
                reuse = self.arm is not None and self.arm.server_key == part.server_key
                est = part.est_s - (90 if reuse else 0) + self.slice_write_s(part.slice)
                if self.args.budget_s and self.elapsed() + est > self.args.budget_s:
                    res["skipped"] = f"time budget ({self.elapsed():.0f} s used, ~{est} s needed)"
                    self.log(f"part {key}: {res['skipped']}")
                    self.save()
                    continue
                self.log(f"part {key}: {part.title}")
                try:
                    self.run_part(part, res)
                except Exception as exc:  # noqa: BLE001 - a failed part is recorded; the next one runs
                    res["error"] = repr(exc)[-1500:]
                    self.log(f"part {key} failed: {res['error'][:300]}")
                    self.stop_server()
                res["host_rss_peak_gib"] = round(self.rss.peak / 2**30, 2) if self.rss else res.get("host_rss_peak_gib")
                self.save()
        finally:
            self.stop_server()
            self.save()
        return 0

    def slice_write_s(self, name: str) -> float:
        """Seconds to write the slice if this run has not (~1 GB/s measured on the device; part a's 2.5 GB slice is
        in est_s already)."""
        made = self.results["slices"].get(name)
        if (made and Path(made.get("path", "")).is_file()) or name == PARTS["a"].slice:
            return 0.0
        return slice_plan(name).file_data_nbytes / 0.8e9

    def trace_wait_s(self) -> float:
        """How long to wait for the profiler's trace file: 90 s, less when the budget is nearer."""
        if not self.args.budget_s:
            return 90.0
        return max(10.0, min(90.0, self.args.budget_s - self.elapsed() - 15))

    def budget_left(self, reserve: float) -> bool:
        return not self.args.budget_s or self.elapsed() + reserve < self.args.budget_s

    def run_part(self, part: Part, res: dict) -> None:
        arm = self.server(part, res)
        self.save()
        for step in part.steps:
            if step == "startup":
                continue
            if not self.budget_left(30):
                res.setdefault("skipped_steps", []).append(step)
                continue
            self.log(f"part {part.key}: {step}")
            if step == "decode":
                rows = res.setdefault("decode", [])
                for c in part.concurrency:
                    if not self.budget_left(20 + (part.in_len // 2048) * 3 * (c // 8 + 1)):
                        res.setdefault("skipped_steps", []).append(f"decode c={c}")
                        continue
                    before = spec_counters(arm) if part.spec_k else None
                    rows.append(measure.decode(arm, c, part.in_len, OUT_LEN, self.vocab))
                    if before is not None:
                        from mtp import metrics_delta

                        # the warm-up wave's few tokens are counted too
                        rows[-1]["spec"] = dict(metrics_delta(before, spec_counters(arm)), k=part.spec_k)
                    self.log(f"decode {rows[-1]}")
                    self.save()
            elif step == "prefill":
                n = part.prefill_requests or max(4, min(32, 65536 // part.in_len))
                res["prefill"] = measure.prefill(arm, min(8, n), n, part.in_len, self.vocab)
                self.log(f"prefill {res['prefill']}")
            elif step == "logprobs":
                res["logprobs"] = measure.first_token_logprobs(arm, measure.logprob_prompts(self.vocab))
            elif step == "profile":
                self.profile(part, arm, res)
            self.save()

    def profile(self, part: Part, arm: SliceArm, res: dict) -> None:
        prof = res.setdefault("profile", {})
        decoded = {r["concurrency"]: r for r in res.get("decode", []) if r.get("ttft_ms_max")}
        for c in part.profile_concurrency or self.args.profile_concurrency:
            if not self.budget_left(40):
                res.setdefault("skipped_steps", []).append(f"profile decode c={c}")
                continue
            ttft = decoded.get(c, {}).get("ttft_ms_max", 3000.0) / 1e3
            max_tokens = min(PROFILE_MAX_TOKENS, part.model_len - part.in_len - 8)
            prof[f"decode_c{c}"] = measure.profile_decode(arm, arm.trace_dir, c, part.in_len, self.vocab, ttft,
                                                          part.profile_decode_s or PROFILE_DECODE_S, max_tokens,
                                                          self.trace_wait_s())
            self.log(f"profile decode c={c}: {_short(prof[f'decode_c{c}'])}")
            self.save()
        if not self.budget_left(40):
            res.setdefault("skipped_steps", []).append("profile prefill")
        else:
            prof["prefill"] = measure.profile_prefill(arm, arm.trace_dir, MAX_NUM_BATCHED_TOKENS, 3, self.vocab,
                                                      self.trace_wait_s())
            self.log(f"profile prefill: {_short(prof['prefill'])}")


def spec_counters(arm: SliceArm) -> dict:
    """vLLM's spec-decode counters (bench/mtp.py's parse of /metrics)."""
    from mtp import _metrics, parse_spec_metrics

    return parse_spec_metrics(_metrics(arm))


def _short(p: dict) -> str:
    return json.dumps({k: p.get(k) for k in ("steps", "kernels", "per_step_us", "error", "warning") if k in p})


def _interrupt(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def run(args) -> int:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    # `timeout` sends SIGTERM: stop the server and write what was measured (Runner.run's finally)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return Runner(args).run()
    finally:
        signal.signal(signal.SIGTERM, previous)
