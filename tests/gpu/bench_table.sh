#!/bin/bash
# The strata vs llama.cpp table on a GPU host, in one command, printed by strata-bench itself:
#
#   tests/gpu/bench_table.sh LLAMA_BENCH MODEL.gguf [OUT_DIR]
#
# Grid (defaults; each can be changed through the environment):
#   strata every expert resident (--vram-budget auto)  vs  llama.cpp -ngl 99
#   strata --vram-budget 24GiB and 12GiB               vs  llama.cpp -ngl 99 --n-cpu-moe N -lm none, N estimated
#                                                          from the model for the same device memory
#                                                          (LLAMA_N_CPU_MOE=0,N1,N2 gives them, one per budget)
#   tests pp512, pp4096, tg128; 3 repetitions after one untimed run; GPU memory and utilization through NVML.
# strata's grid runs first, then llama.cpp's (one llama-bench per budget); both append to OUT_DIR/gpu.jsonl and
# the table pairs the rows of equal budgets with their ratio. Each row is printed (stderr) as it finishes; the
# Markdown table is printed last, made from the file, so a run cut short by a time limit still shows every row
# it finished.
#
# LLAMA_BENCH may not exist yet: with LLAMA_SRC=/path/llama-src.tgz (a llama.cpp source tree, top folder
# llama.cpp/) it is built in the background (nice 19, LLAMA_JOBS cores) while strata is measured, and the llama.cpp
# part waits for it (LLAMA_WAIT seconds). The build then shares the host with strata's runs: the load average
# is in every row.
#
# Needs: python3 with numpy, rich, pynvml (nvidia-ml-py), httpx, gguf, platformdirs; libstrata built with CUDA
# (STRATA_LIB=/path/libstrata.so, or strata/lib/). No virtual environment: PYTHONPATH gets this tree (and
# /tmp/site when it exists, where wheels can be installed with pip --target).
# Environment: DEVICE (cuda), BUDGETS (auto,24GiB,12GiB), LLAMA_N_CPU_MOE (auto per budget), PROMPTS (512,4096),
# GEN (128), REPS (3), STRATA_LIMIT (s, 330), LLAMA_LIMIT (s, 200), LLAMA_ARGS (more llama-bench flags, e.g.
# '-ub 4096 -b 4096'), EXTRA (more strata-bench flags for both parts), LLAMA_SRC, LLAMA_JOBS (8), LLAMA_WAIT (420).
set -u
usage="usage: $0 LLAMA_BENCH MODEL.gguf [OUT_DIR]"
LLAMA_BENCH=${1:?$usage}
MODEL=${2:?$usage}
OUT_DIR=${3:-${OUT:-/tmp}/bench_table}
tree=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}"
[ -d /tmp/site ] && export PYTHONPATH="$PYTHONPATH:/tmp/site"
export PYTHONUNBUFFERED=1
DEVICE=${DEVICE:-cuda}
BUDGETS=${BUDGETS:-auto,24GiB,12GiB}
PROMPTS=${PROMPTS:-512,4096}
GEN=${GEN:-128}
REPS=${REPS:-3}
mkdir -p "$OUT_DIR"
records="$OUT_DIR/gpu.jsonl"
rm -f "$records"
[ -f "$MODEL" ] || { echo "bench_table: $MODEL: no such model file" >&2; exit 2; }

build_pid=
if [ ! -x "$LLAMA_BENCH" ] && [ -n "${LLAMA_SRC:-}" ]; then
  echo "bench_table: building llama-bench from $LLAMA_SRC in the background (log: $OUT_DIR/llama_build.log)"
  (
    set -e
    mkdir -p /tmp/lcsrc && tar xzf "$LLAMA_SRC" -C /tmp/lcsrc
    gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
    nice -n 19 cmake -S /tmp/lcsrc/llama.cpp -B /tmp/lcpp "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF
    nice -n 19 cmake --build /tmp/lcpp --target llama-bench -j "${LLAMA_JOBS:-8}"
    mkdir -p "$(dirname "$LLAMA_BENCH")" && cp /tmp/lcpp/bin/llama-bench "$LLAMA_BENCH"
  ) > "$OUT_DIR/llama_build.log" 2>&1 &
  build_pid=$!
elif [ ! -x "$LLAMA_BENCH" ]; then
  echo "bench_table: $LLAMA_BENCH is not an executable llama-bench (give LLAMA_SRC=llama-src.tgz to build it)" >&2
  exit 2
fi

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
echo "load average: $(cat /proc/loadavg)"
# the sampler on this host's real NVML, before the long run (a few seconds)
timeout 90 python3 -m pytest -q -p no:cacheprovider -o addopts="" "$tree/tests/test_bench_nvml.py" 2>&1 | tail -2

common=(--device "$DEVICE" -m "$MODEL" -p "$PROMPTS" -n "$GEN" -r "$REPS" --vram-budget "$BUDGETS"
        --output "$records" --format md)
# shellcheck disable=SC2206
[ -n "${EXTRA:-}" ] && common+=($EXTRA)

echo "python3 -m strata_bench run --target strata ${common[*]}"
timeout --signal=INT --kill-after=30 "${STRATA_LIMIT:-330}" \
  python3 -m strata_bench run --target strata "${common[@]}" > "$OUT_DIR/strata.md"
rc_s=$?
echo "strata part: exit status $rc_s (0 all measured, 1 some configurations failed, 130 stopped at STRATA_LIMIT)"

if [ -n "$build_pid" ]; then
  echo "bench_table: waiting for the llama-bench build ($(date -u +%T))"
  waited=0
  while kill -0 "$build_pid" 2>/dev/null && [ "$waited" -lt "${LLAMA_WAIT:-420}" ]; do sleep 5; waited=$((waited + 5)); done
  wait "$build_pid" 2>/dev/null
  tail -3 "$OUT_DIR/llama_build.log"
fi
rc_l=2
if [ -x "$LLAMA_BENCH" ]; then
  largs=(run --target llama.cpp --llama-bench "$LLAMA_BENCH" "${common[@]}")
  [ -n "${LLAMA_N_CPU_MOE:-}" ] && largs+=(--llama-n-cpu-moe "$LLAMA_N_CPU_MOE")
  [ -n "${LLAMA_ARGS:-}" ] && largs+=(--llama-args "$LLAMA_ARGS")
  echo "python3 -m strata_bench ${largs[*]}"
  timeout --signal=INT --kill-after=30 "${LLAMA_LIMIT:-200}" python3 -m strata_bench "${largs[@]}" > "$OUT_DIR/llama.md"
  rc_l=$?
  echo "llama.cpp part: exit status $rc_l"
else
  echo "bench_table: no llama-bench at $LLAMA_BENCH; the table has strata's rows only" >&2
fi
echo
[ -s "$records" ] || { echo "bench_table: no rows were measured" >&2; exit 1; }
python3 -m strata_bench show "$records" --format md | tee "$OUT_DIR/table.md"
[ "$rc_s" = 0 ] && [ "$rc_l" = 0 ]
