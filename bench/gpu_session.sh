#!/usr/bin/env bash
# One device call: install the offline vLLM bundle, then GPU tests, kernel benchmarks and an end-to-end smoke.
#   run with carry [".gpu/bundle"]:  bash bench/gpu_session.sh [interp] [tests] [bench] [ncu_gguf] [consumer] [e2e] [mtp] [agentic] [slice]
#   (or carry [".gpu/bundle_slim", ...]: SLIM=1 make_bundle.sh, ~30 MiB, leaves room for .whl and models)
# Results land in $OUT (at most 8 files come back): gpu_tests.log, sparse_mla.md, indexer.md, session.log,
#   e2e.md, results.json, e2e_logs.tar.gz; mtp: mtp.md, mtp.json, mtp_logs.tar.gz; agentic: agentic.md,
#   agentic.json, agentic_server.log; slice: slice.md, slice.json, slice_logs.tar.gz
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
steps=${*:-tests bench e2e}
log() { echo "== $(date +%T) $*" | tee -a "$OUT/session.log"; }
stop_servers() { pkill -INT -f "vllm serve" 2>/dev/null; sleep 3; pkill -KILL -f "vllm serve" 2>/dev/null; }
BUNDLE=${BUNDLE:-$([[ -d .gpu/bundle_slim ]] && echo .gpu/bundle_slim || echo .gpu/bundle)}
if [[ ! -f /tmp/vllm_site/env.sh ]]; then
  log "install $BUNDLE"; bash "$BUNDLE/install.sh" >> "$OUT/session.log" 2>&1 || { log "install failed"; exit 1; }
fi
source /tmp/vllm_site/env.sh
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
# The bundle lacks packages vLLM's quantization registry imports for every quantized model, GGUF included.  Fetch
# them here once (x86-64, cp312):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .whl compressed-tensors==0.17.0 humming-kernels==0.1.4 loguru pyelftools
# and carry [".gpu/bundle", ".whl"].
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
nvidia-smi -L | tee -a "$OUT/session.log"
python -m glm5_shim doctor >> "$OUT/session.log" 2>&1
if [[ " $steps " == *" interp "* ]]; then
  # the interpreter kernel tests, in the child process tests/test_interpreter_suite.py starts (GPU hidden there);
  # CPU only, so it runs in the background next to the GPU steps
  log "interpreter suite (background)"
  (timeout ${INTERP_TIMEOUT:-900} python -m pytest -q tests/test_interpreter_suite.py -p no:cacheprovider 2>&1 \
    | tail -30 > "$OUT/interp_tests.log") &
  INTERP_PID=$!
fi
if [[ " $steps " == *" tests "* ]]; then
  if [[ -n "${GPU_TEST_SHARDS:-}" ]]; then
    # ';'-separated pytest argument lists, each in its own process at once: the Triton JIT and the float64
    # references are CPU work (16 cores here), the GPU share of these tests is small
    IFS=';' read -ra shards <<< "$GPU_TEST_SHARDS"
    log "tests: ${#shards[@]} shards in parallel"
    pids=()
    for i in "${!shards[@]}"; do
      (eval "set -- ${shards[$i]}"; OMP_NUM_THREADS=$((16 / ${#shards[@]} + 1)) timeout ${TESTS_TIMEOUT:-900} \
        python -m pytest -q "$@" -p no:cacheprovider > "/tmp/gpu_shard_$i.log" 2>&1) &
      pids+=($!)
    done
    wait "${pids[@]}"
    for i in "${!shards[@]}"; do
      { echo "== shard $i: ${shards[$i]}"; tail -40 "/tmp/gpu_shard_$i.log"; } >> "$OUT/gpu_tests.log"
    done
    log "tests done"
  else
    # GPU_TESTS: pytest arguments as a shell line (quotes kept: -k "a and b"), as each GPU_TEST_SHARDS entry
    log tests; (eval "set -- ${GPU_TESTS:-tests/gpu}"; timeout ${TESTS_TIMEOUT:-900} python -m pytest -q "$@" \
      -p no:cacheprovider 2>&1 | tail -80 > "$OUT/gpu_tests.log")
  fi
fi
if [[ " $steps " == *" bench "* ]]; then
  if [[ " ${BENCHES:-sparse_mla indexer} " == *" sparse_mla "* ]]; then
    log "sparse_mla ${SPARSE_MLA_ARGS:-}"
    timeout ${SPARSE_MLA_TIMEOUT:-900} python bench/sparse_mla.py --out /tmp/bench_sparse ${SPARSE_MLA_ARGS:-} \
      >> "$OUT/session.log" 2>&1
    cp /tmp/bench_sparse/sparse_mla.json "$OUT/sparse_mla.json" 2>/dev/null
    cp /tmp/bench_sparse/sparse_mla.md "$OUT/sparse_mla.md" 2>/dev/null
  fi
  if [[ " ${BENCHES:-sparse_mla indexer} " == *" indexer "* ]]; then
    log indexer; timeout 900 python bench/indexer.py --out /tmp/bench_indexer >> "$OUT/session.log" 2>&1
    cp /tmp/bench_indexer/*.md "$OUT/indexer.md" 2>/dev/null
  fi
  if [[ " ${BENCHES:-sparse_mla indexer} " == *" gguf "* ]]; then
    log "gguf_matmul ${GGUF_ARGS:-}"
    # SIGINT, so the bench writes the rows it has (its finally block) when the time runs out
    # GGUF_ARGS: a shell line (quotes kept: --decode-sweep-tokens '' passes an empty list)
    (eval "set -- ${GGUF_ARGS:-}"; timeout -s INT -k 20 ${GGUF_TIMEOUT:-600} python bench/gguf_matmul.py \
      --out /tmp/bench_gguf "$@" > "$OUT/gguf_matmul.log" 2>&1)
    cp /tmp/bench_gguf/gguf_matmul.md /tmp/bench_gguf/gguf_matmul.json "$OUT/" 2>/dev/null
  fi
fi
if [[ " $steps " == *" ncu_gguf "* ]]; then
  # ncu on the MoE kernels (bench/profile_gguf_matmul.py): stall reasons, issue rate, memory throughput.
  # Reads hardware counters only on the Firecracker runtime (KINDS.md).  NCU_GGUF_ARGS: ';'-separated argument
  # lists of the script, one ncu run each, e.g. "--type Q4_K --tokens 32;--type Q4_K --tokens 32 --ahead 2";
  # NCU_KERNEL: the kernels' regex (the register-MMA MoE kernel; _moe_kernel for the prefill tiles)
  IFS=';' read -ra ncu_runs <<< "${NCU_GGUF_ARGS:---type Q4_K --tokens 32}"
  for args in "${ncu_runs[@]}"; do
    log "ncu_gguf $args"
    { echo "==== ncu_gguf $args"
      timeout ${NCU_TIMEOUT:-240} ncu --clock-control none -k regex:${NCU_KERNEL:-_mma_moe_kernel} --launch-skip 6 \
        --launch-count 2 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
        --section Occupancy --section MemoryWorkloadAnalysis --section InstructionStats --section LaunchStats \
        python bench/profile_gguf_matmul.py $args 2>&1; } >> "$OUT/ncu_gguf.txt"
    log "ncu_gguf exit $?"
  done
fi
if [[ " $steps " == *" consumer "* ]]; then
  # issue #52: the GPU tests with every kernel compiled for a consumer target and assembled for this GPU, planned as on
  # an RTX PRO 6000 (89) or an RTX 3090 (86, 80); CONSUMER_PTX: the targets (default "89 80"), CONSUMER_TESTS: the
  # test files (default the sparse-MLA, indexer and GGUF GPU test files).  Compiling is most of the time: each
  # (target, file) is a process of its own, all at once (16 cores), each file's log tail kept.
  files=${CONSUMER_TESTS:-tests/gpu/test_sparse_mla_gpu.py tests/gpu/test_indexer_gpu.py tests/gpu/test_gguf_matmul_gpu.py tests/gpu/test_gguf_mma_gpu.py}
  mkdir -p /tmp/consumer
  for ptx in ${CONSUMER_PTX:-89 80}; do
    log "consumer sm_$ptx: $files"
    for f in $files; do
      (GLM5_SHIM_CONSUMER_PTX=$ptx timeout ${CONSUMER_TIMEOUT:-400} python -m pytest -q -rfE "$f" -p no:cacheprovider \
         > "/tmp/consumer/sm$ptx-$(basename "$f" .py).log" 2>&1) &
    done
  done
  wait
  for ptx in ${CONSUMER_PTX:-89 80}; do
    for f in /tmp/consumer/sm$ptx-*.log; do echo "## $f"; tail -25 "$f"; done > "$OUT/consumer_sm$ptx.log"
    log "consumer sm_$ptx: $(for f in /tmp/consumer/sm$ptx-*.log; do tail -1 "$f"; done | tr '\n' ';')"
  done
fi
if [[ " $steps " == *" e2e "* ]]; then
  # bench/e2e.py: tiny GLM-5 GGUFs served through launch.sh, shim-forced vs native, then the GPU test on its results.
  # Models and server logs stay in /tmp (too big / too many for $OUT); logs come back as one archive.
  log "e2e ${E2E_ARGS:-}"
  rm -rf /tmp/e2e_run
  timeout ${E2E_TIMEOUT:-540} python bench/e2e.py all --out /tmp/e2e_run ${E2E_ARGS:-} 2>&1 | grep -E "^\[e2e\]|Error|error" \
    | cut -c1-400 >> "$OUT/session.log"
  stop_servers
  cp /tmp/e2e_run/results.json /tmp/e2e_run/e2e.md "$OUT/" 2>/dev/null
  (cd /tmp/e2e_run && tar czf "$OUT/e2e_logs.tar.gz" *.log 2>/dev/null)
  log "e2e test"
  E2E_RESULTS=/tmp/e2e_run timeout 120 python -m pytest -q tests/gpu/test_e2e_serve.py -p no:cacheprovider 2>&1 \
    | tail -40 >> "$OUT/gpu_tests.log"
fi
if [[ " $steps " == *" mtp "* ]]; then
  # bench/mtp.py (#17): tiny GGUFs served with their own MTP layer as the draft, shim and native paths, K = 0 and
  # MTP_ARGS' --k; greedy equality, acceptance, tokens/s at several concurrencies
  log "mtp ${MTP_ARGS:-}"
  rm -rf /tmp/mtp_run
  timeout ${MTP_TIMEOUT:-480} python bench/mtp.py run --out /tmp/mtp_run ${MTP_ARGS:-} > /tmp/mtp_stdout.log 2>&1
  tail -5 /tmp/mtp_stdout.log | cut -c1-400 >> "$OUT/session.log"
  stop_servers
  cp /tmp/mtp_run/mtp.json /tmp/mtp_run/mtp.md "$OUT/" 2>/dev/null
  (cd /tmp/mtp_run && tar czf "$OUT/mtp_logs.tar.gz" *.log /tmp/mtp_stdout.log 2>/dev/null)
fi
if [[ " $steps " == *" agentic "* ]]; then
  # bench/agentic.py (#18): a scripted tiny GGUF served with --reasoning-parser glm45 --tool-call-parser glm47
  # --enable-auto-tool-choice; /tokenize against Jinja, tool calls and reasoning over the openai client.
  log "agentic ${AGENTIC_ARGS:-}"
  rm -rf /tmp/agentic_run
  timeout ${AGENTIC_TIMEOUT:-420} python bench/agentic.py run --out /tmp/agentic_run ${AGENTIC_ARGS:-} 2>&1 \
    | grep -E "^\[agentic\]|Error|error" | cut -c1-400 >> "$OUT/session.log"
  stop_servers
  cp /tmp/agentic_run/agentic.json /tmp/agentic_run/agentic.md "$OUT/" 2>/dev/null
  cp /tmp/agentic_run/server_agentic.log "$OUT/agentic_server.log" 2>/dev/null
  log "agentic test"
  AGENTIC_RESULTS=/tmp/agentic_run timeout 120 python -m pytest -q tests/gpu/test_agentic_serve.py -p no:cacheprovider \
    2>&1 | tail -30 >> "$OUT/gpu_tests.log"
fi
if [[ " $steps " == *" slice "* ]]; then
  # bench/slice_serve.py: GLM-5 slices at the real sizes made here (/tmp/slices), served through launch.sh, measured
  # (issue #16).  Back in $OUT: slice.md, slice.json, slice_logs.tar.gz (server logs + the session's lines); the
  # torch-profiler traces stay in /tmp (tens of MB).  SLICE_ARGS e.g. "--parts a,b,c --budget-s 480".
  # what is left of the device call's 10 minutes (SECONDS: since this script started), unless SLICE_TIMEOUT says;
  # without --budget-s in SLICE_ARGS, parts stop being started 45 s before that (a server stop and the copy below)
  slice_left=${SLICE_TIMEOUT:-$((585 - SECONDS))}
  slice_args="${SLICE_ARGS:-}"
  [[ "$slice_args" == *--budget-s* ]] || slice_args="$slice_args --budget-s $((slice_left - 45))"
  log "slice $slice_args (timeout ${slice_left} s)"
  rm -rf /tmp/slice_run
  if (( slice_left < 120 )); then
    # no part could start (a negative budget or timeout would only fail on its own)
    log "slice: not started, ${slice_left} s left of the call"
  else
    # on the timeout's SIGTERM the runner stops its server (by process group) and writes what it has
    timeout "$slice_left" python bench/slice_serve.py run --out /tmp/slice_run $slice_args > /tmp/slice_run.log 2>&1
    log "slice exit $?"
  fi
  grep -E "^\[slice\]|Error" /tmp/slice_run.log | cut -c1-300 | tail -60 >> "$OUT/session.log"
  cp /tmp/slice_run/slice.md /tmp/slice_run/slice.json "$OUT/" 2>/dev/null
  cp /tmp/slice_run.log /tmp/slice_run/ 2>/dev/null
  (cd /tmp/slice_run && tar czf "$OUT/slice_logs.tar.gz" *.log 2>/dev/null)
fi
if [[ -n "${INTERP_PID:-}" ]]; then log "waiting for the interpreter suite"; wait "$INTERP_PID"; fi
log done
