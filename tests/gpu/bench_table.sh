#!/bin/bash
# The strata vs llama.cpp table on a GPU host, in one command, printed by strata-bench itself:
#
#   tests/gpu/bench_table.sh LLAMA_BENCH MODEL [OUT_DIR]
#
# MODEL is a GGUF file, or preset:NAME[:QUANT] (e.g. preset:qwen3-30b-a3b:q8_0) to make it with
# `strata.model.ensure_model` (seed 0; STRATA_CACHE_DIR, default /tmp/sc).
#
# Grid (defaults; each can be changed through the environment):
#   strata every expert resident (--vram-budget auto)  vs  llama.cpp -ngl 99
#   strata --vram-budget 12GiB and 24GiB               vs  llama.cpp -ngl 99 --n-cpu-moe N -lm none, N estimated
#                                                          from the model for the same device memory
#                                                          (LLAMA_N_CPU_MOE=0,N1,N2 gives them, one per budget)
#   tests pp512, pp4096, tg128; 3 repetitions after one untimed run; GPU memory and utilization through NVML.
# llama.cpp at its best: every test at its default micro-batch (-ub 512 -b 2048), and the prompts longer than
# 512 again at -ub 4096 -b 4096 (LLAMA_UBATCH=512,4096), each with its own --n-cpu-moe for the budget (a larger
# micro-batch needs larger compute buffers); a micro-batch that does not fit is halved until one runs. The
# ratio row pairs strata with the faster llama.cpp row of each test that kept to the budget and names the flags
# that won. Both processes' device memory peaks (NVML, per process) are in the VRAM peak column, marked
# "(over)" where a peak exceeds the row's budget.
# strata's grid runs first, then llama.cpp's (two llama-bench runs per budget); both append to OUT_DIR/gpu.jsonl
# and the table pairs the rows of equal budgets with their ratio. Each row is printed (stderr) as it finishes;
# the Markdown table is printed last, made from the file, so a run cut short by a time limit still shows every
# row it finished.
#
# Setup it does when asked or needed (so that one device call can hold everything):
#   WHEELS='dir/*.whl'  installs those wheels into /tmp/site (pip --target, no index) and puts it on PYTHONPATH;
#   STRATA_LIB unset and no strata/lib/libstrata.so: builds native/ with CMake into /tmp/bg (STRATA_JOBS cores);
#   LLAMA_BENCH missing and LLAMA_SRC=llama-src.tgz (a llama.cpp tree, top folder llama.cpp/): builds llama-bench
#   in the background (nice 19, LLAMA_JOBS cores) while strata is measured; the llama.cpp part waits for it
#   (LLAMA_WAIT seconds). The build then shares the host with strata's runs: the load average is in every row.
#
# Needs: python3 with numpy, rich, pynvml (nvidia-ml-py), httpx, gguf, platformdirs, tokenizers (for presets).
# No virtual environment: PYTHONPATH gets this tree (and /tmp/site when it exists).
# Environment: DEVICE (cuda), BUDGETS (auto,12GiB,24GiB: the order they run in; a time limit cuts the last first),
# LLAMA_N_CPU_MOE (auto per budget), PROMPTS (512,4096),
# GEN (128), REPS (3), STRATA_LIMIT (s, 330), LLAMA_LIMIT (s, 300), LLAMA_UBATCH (512,4096: the first runs every
# test, the others the longer prompts), LLAMA_ARGS (more llama-bench flags for every llama.cpp run; a -ub or -b
# there replaces the LLAMA_UBATCH runs), EXTRA (more strata-bench flags for both parts), WHEELS, STRATA_JOBS (8), LLAMA_SRC,
# LLAMA_JOBS (all cores), LLAMA_WAIT (420), DEADLINE (seconds from the start by which the table must be printed:
# each part's limit is cut to fit, leaving 20 s for the table; e.g. 570 inside a 600 s call).
# STRATA_BENCH_COMMIT (COMMIT or COMMIT+dirty): the commit the rows name, for a tree copied without its own git
# metadata (otherwise `git rev-parse HEAD` of the tree).
set -u
usage="usage: $0 LLAMA_BENCH MODEL.gguf|preset:NAME[:QUANT] [OUT_DIR]"
LLAMA_BENCH=${1:?$usage}
MODEL=${2:?$usage}
OUT_DIR=${3:-${OUT:-/tmp}/bench_table}
tree=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 STRATA_CACHE_DIR=${STRATA_CACHE_DIR:-/tmp/sc}
DEVICE=${DEVICE:-cuda}
BUDGETS=${BUDGETS:-auto,12GiB,24GiB}
PROMPTS=${PROMPTS:-512,4096}
GEN=${GEN:-128}
REPS=${REPS:-3}
mkdir -p "$OUT_DIR"
records="$OUT_DIR/gpu.jsonl"
rm -f "$records"
step() { echo "[$(date -u +%T) +${SECONDS}s] $*"; }
# seconds a part may take: its own limit, cut to what is left before DEADLINE (less 20 s for the table)
limit() {
  local own=$1
  if [ -n "${DEADLINE:-}" ]; then
    local left=$((DEADLINE - SECONDS - 20))
    [ "$left" -lt "$own" ] && own=$left
  fi
  [ "$own" -lt 1 ] && own=1
  echo "$own"
}

if [ -n "${WHEELS:-}" ]; then
  # shellcheck disable=SC2086
  python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site $WHEELS 2>&1 | grep -v WARNING
fi
[ -d /tmp/site ] && export PYTHONPATH="$PYTHONPATH:/tmp/site"

build_pid=
if [ ! -x "$LLAMA_BENCH" ] && [ -n "${LLAMA_SRC:-}" ]; then
  step "building llama-bench from $LLAMA_SRC in the background (log: $OUT_DIR/llama_build.log)"
  (
    set -e
    mkdir -p /tmp/lcsrc && tar xzf "$LLAMA_SRC" -C /tmp/lcsrc
    gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
    nice -n 19 cmake -S /tmp/lcsrc/llama.cpp -B /tmp/lcpp "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF
    nice -n 19 cmake --build /tmp/lcpp --target llama-bench -j "${LLAMA_JOBS:-$(nproc)}"
    mkdir -p "$(dirname "$LLAMA_BENCH")"
    [ -e "$LLAMA_BENCH" ] || cp /tmp/lcpp/bin/llama-bench "$LLAMA_BENCH"
  ) > "$OUT_DIR/llama_build.log" 2>&1 &
  build_pid=$!
elif [ ! -x "$LLAMA_BENCH" ]; then
  echo "bench_table: $LLAMA_BENCH is not an executable llama-bench (give LLAMA_SRC=llama-src.tgz to build it)" >&2
  exit 2
fi

if [ -z "${STRATA_LIB:-}" ] && [ ! -f "$tree/strata/lib/libstrata.so" ]; then
  step "building libstrata into /tmp/bg"
  cmake -S "$tree/native" -B /tmp/bg -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$(command -v python3)" \
    > "$OUT_DIR/strata_build.log" 2>&1 &&
    cmake --build /tmp/bg -j "${STRATA_JOBS:-8}" >> "$OUT_DIR/strata_build.log" 2>&1 ||
    { tail -20 "$OUT_DIR/strata_build.log" >&2; exit 2; }
  export STRATA_LIB=/tmp/bg/libstrata.so
fi

if [[ "$MODEL" == preset:* ]]; then
  IFS=: read -r _ preset quant <<< "$MODEL"
  step "making the $preset model (${quant:-default quant})"
  MODEL=$(python3 -c "import sys; from strata.model import ensure_model
kw = {'preset': sys.argv[1], 'seed': 0}
if sys.argv[2]: kw['quant'] = sys.argv[2]
print(ensure_model(**kw))" "$preset" "${quant:-}") || exit 2
fi
[ -f "$MODEL" ] || { echo "bench_table: $MODEL: no such model file" >&2; exit 2; }

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
step "load average: $(cat /proc/loadavg)"
# the sampler on this host's real NVML, before the long run (a few seconds)
timeout 90 python3 -m pytest -q -p no:cacheprovider -o addopts="" "$tree/tests/test_bench_nvml.py" 2>&1 | tail -2

common=(--device "$DEVICE" -m "$MODEL" -p "$PROMPTS" -n "$GEN" -r "$REPS" --vram-budget "$BUDGETS"
        --output "$records" --format md)
# shellcheck disable=SC2206
[ -n "${EXTRA:-}" ] && common+=($EXTRA)

step "python3 -m strata_bench run --target strata ${common[*]}"
timeout --signal=INT --kill-after=10 "$(limit "${STRATA_LIMIT:-330}")" \
  python3 -m strata_bench run --target strata "${common[@]}" > "$OUT_DIR/strata.md"
rc_s=$?
step "strata part: exit status $rc_s (0 all measured, 1 some configurations failed, 124 stopped at its time limit)"

if [ -n "$build_pid" ]; then
  step "waiting for the llama-bench build"
  waited=0
  wait_for=$(limit "${LLAMA_WAIT:-420}")
  while kill -0 "$build_pid" 2>/dev/null && [ "$waited" -lt "$wait_for" ]; do sleep 5; waited=$((waited + 5)); done
  wait "$build_pid" 2>/dev/null
  tail -2 "$OUT_DIR/llama_build.log"
fi
rc_l=2
if [ -x "$LLAMA_BENCH" ]; then
  largs=(run --target llama.cpp --llama-bench "$LLAMA_BENCH" "${common[@]}")
  [ -n "${LLAMA_N_CPU_MOE:-}" ] && largs+=(--llama-n-cpu-moe "$LLAMA_N_CPU_MOE")
  [ -n "${LLAMA_ARGS:-}" ] && largs+=(--llama-args "$LLAMA_ARGS")
  largs+=(--llama-ubatch "${LLAMA_UBATCH:-512,4096}")
  step "python3 -m strata_bench ${largs[*]}"
  timeout --signal=INT --kill-after=10 "$(limit "${LLAMA_LIMIT:-300}")" python3 -m strata_bench "${largs[@]}" > "$OUT_DIR/llama.md"
  rc_l=$?
  step "llama.cpp part: exit status $rc_l (0 all measured, 1 some settings failed, 124 stopped at its time limit)"
else
  echo "bench_table: no llama-bench at $LLAMA_BENCH; the table has strata's rows only" >&2
fi
echo
[ -s "$records" ] || { echo "bench_table: no rows were measured" >&2; exit 1; }
python3 -m strata_bench show "$records" --format md | tee "$OUT_DIR/table.md"
# the charts of the same rows (decode and hit rate against the cache, prompt speed against its length)
python3 -m strata_bench plot "$records" --out "$OUT_DIR/plots" >/dev/null 2>&1 || true
[ "$rc_s" = 0 ] && [ "$rc_l" = 0 ]
