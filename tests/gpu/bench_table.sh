#!/bin/bash
# The strata vs llama.cpp table on a GPU host, in one command, printed by strata-bench itself:
#
#   tests/gpu/bench_table.sh /path/to/llama-bench /path/to/model.gguf [OUT_DIR]
#
# Grid (defaults; each can be changed through the environment):
#   strata every expert resident (--vram-budget auto)  vs  llama.cpp -ngl 99
#   strata --vram-budget 24GiB and 12GiB               vs  llama.cpp -ngl 99 --n-cpu-moe N, N estimated from the
#                                                          model for the same device memory (LLAMA_N_CPU_MOE=0,N1,N2
#                                                          gives them; one per budget, in the same order)
#   tests pp512, pp4096, tg128; 3 repetitions after one untimed run; GPU memory and utilization through NVML.
# Each row is printed (stderr) as it finishes and appended to OUT_DIR/gpu.jsonl; the Markdown table is printed
# last, made from that file, so a run cut short by TIME_LIMIT still prints every row it finished.
#
# Needs: python3 with numpy, rich, pynvml (nvidia-ml-py), httpx, gguf, platformdirs; libstrata built with CUDA
# (STRATA_LIB=/path/libstrata.so, or strata/lib/). No virtual environment: PYTHONPATH gets this tree (and
# /tmp/site when it exists, where wheels can be installed with pip --target).
# Environment: DEVICE (cuda), BUDGETS (auto,24GiB,12GiB), LLAMA_N_CPU_MOE (auto per budget), PROMPTS (512,4096),
# GEN (128), REPS (3), TIME_LIMIT (seconds for the whole run, 420), EXTRA (more strata-bench flags).
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
TIME_LIMIT=${TIME_LIMIT:-420}
mkdir -p "$OUT_DIR"
records="$OUT_DIR/gpu.jsonl"
rm -f "$records"

[ -x "$LLAMA_BENCH" ] || { echo "bench_table: $LLAMA_BENCH is not an executable llama-bench" >&2; exit 2; }
[ -f "$MODEL" ] || { echo "bench_table: $MODEL: no such model file" >&2; exit 2; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
echo "load average: $(cat /proc/loadavg)"

# the sampler on this host's real NVML, and the failed-row path, before the long run (a few seconds)
timeout 90 python3 -m pytest -q -p no:cacheprovider -o addopts="" "$tree/tests/test_bench_nvml.py" 2>&1 | tail -3

args=(run --device "$DEVICE" --target strata --target llama.cpp --llama-bench "$LLAMA_BENCH" -m "$MODEL"
      -p "$PROMPTS" -n "$GEN" -r "$REPS" --vram-budget "$BUDGETS" --output "$records" --format md)
[ -n "${LLAMA_N_CPU_MOE:-}" ] && args+=(--llama-n-cpu-moe "$LLAMA_N_CPU_MOE")
# shellcheck disable=SC2206
[ -n "${EXTRA:-}" ] && args+=($EXTRA)
echo "python3 -m strata_bench ${args[*]}"
timeout --signal=INT --kill-after=20 "$TIME_LIMIT" python3 -m strata_bench "${args[@]}" > "$OUT_DIR/run.md"
rc=$?
echo "strata-bench run exited with status $rc (0: every configuration measured; 1: some failed, see the table;"\
     "130 or 124: stopped at TIME_LIMIT=$TIME_LIMIT s, the finished rows are kept)"
echo
[ -s "$records" ] || { echo "bench_table: no rows were measured" >&2; exit 1; }
python3 -m strata_bench show "$records" --format md | tee "$OUT_DIR/table.md"
exit $rc
