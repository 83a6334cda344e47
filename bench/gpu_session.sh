#!/usr/bin/env bash
# One device call: install the offline vLLM bundle, then GPU tests, kernel benchmarks and an end-to-end smoke.
#   run with carry [".gpu/bundle"]:  bash bench/gpu_session.sh [tests] [bench] [e2e]
# Results land in $OUT (at most 8 files come back): gpu_tests.log, sparse_mla.md, indexer.md, e2e.md, session.log
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
steps=${*:-tests bench e2e}
log() { echo "== $(date +%T) $*" | tee -a "$OUT/session.log"; }
if [[ ! -f /tmp/vllm_site/env.sh ]]; then
  log install; bash .gpu/bundle/install.sh >> "$OUT/session.log" 2>&1 || { log "install failed"; exit 1; }
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
if [[ " $steps " == *" tests "* ]]; then
  log tests; timeout 900 python -m pytest -q ${GPU_TESTS:-tests/gpu} -p no:cacheprovider 2>&1 | tail -80 > "$OUT/gpu_tests.log"
fi
if [[ " $steps " == *" bench "* ]]; then
  if [[ " ${BENCHES:-sparse_mla indexer} " == *" sparse_mla "* ]]; then
    log sparse_mla; timeout 900 python bench/sparse_mla.py --out /tmp/bench_sparse >> "$OUT/session.log" 2>&1
    cp /tmp/bench_sparse/sparse_mla.md "$OUT/sparse_mla.md" 2>/dev/null
  fi
  if [[ " ${BENCHES:-sparse_mla indexer} " == *" indexer "* ]]; then
    log indexer; timeout 900 python bench/indexer.py --out /tmp/bench_indexer >> "$OUT/session.log" 2>&1
    cp /tmp/bench_indexer/*.md "$OUT/indexer.md" 2>/dev/null
  fi
fi
if [[ " $steps " == *" e2e "* ]]; then
  log e2e; mkdir -p /tmp/m
  python -m glm5_shim make-tiny /tmp/m/tiny.gguf --quant Q8_0 --layers 3 --heads 16 --index-heads 32 \
    --index-topk 128 >> "$OUT/session.log" 2>&1
  for kv in auto fp8_ds_mla; do
    env GLM5_SHIM_ATTENTION=triton ${E2E_INDEXER:-GLM5_SHIM_INDEXER=triton} timeout 600 python bench/e2e_smoke.py run \
      /tmp/shim_$kv.json /tmp/m/tiny.gguf --kv-cache-dtype $kv >> "$OUT/session.log" 2>&1
    timeout 600 python bench/e2e_smoke.py run /tmp/native_$kv.json /tmp/m/tiny.gguf --kv-cache-dtype $kv \
      >> "$OUT/session.log" 2>&1
    { echo "### kv $kv: shim-forced (Triton attention; ${E2E_INDEXER:-GLM5_SHIM_INDEXER=triton}) vs native (FLASHMLA_SPARSE + DeepGEMM)";
      echo; echo "shim: $(python -c "import json; d=json.load(open('/tmp/shim_$kv.json')); d.pop('rows'); print(d)" 2>&1)";
      echo; echo "native: $(python -c "import json; d=json.load(open('/tmp/native_$kv.json')); d.pop('rows'); print(d)" 2>&1)"; echo;
      python bench/e2e_smoke.py compare /tmp/shim_$kv.json /tmp/native_$kv.json; } >> "$OUT/e2e.md" 2>&1
  done
fi
log done
