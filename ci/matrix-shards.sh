#!/usr/bin/env bash
# The regression matrix on N runners, as a plain script: the steps .github/workflows/matrix-gpu.yml runs,
# for any CI system (GitLab, Jenkins, a cron job) or for a dry run on one machine.
#
#   ci/matrix-shards.sh build        build the engine into strata/lib (make native, or cmake alone when
#                                    PYTHON names an interpreter that already has strata's dependencies)
#   ci/matrix-shards.sh shard K N    run shard K of N of $MATRIX into $OUT/shard-K (with its JUnit file and
#                                    summary); every shard runs the reference cell it compares with
#   ci/matrix-shards.sh merge N      merge $OUT/shard-1 .. $OUT/shard-N into $OUT/merged: JUnit, summary,
#                                    the scrubbed report; a shard directory that is missing counts
#   ci/matrix-shards.sh local N      all of it on this machine: the N shards as N processes, then the merge
#
# Environment: MATRIX (default ci/ci.toml), OUT (default matrix-ci), PYTHON (an interpreter that has strata's
# dependencies; default .venv/bin/python, which `build` sets up), MATRIX_ARGS (more flags for `repro_matrix run`, e.g. "--set device=cpu" on a
# runner without a GPU), GITHUB_STEP_SUMMARY (the summary is appended to it when set).
#
# Exit status is repro_matrix's: 0 every cell passes (or fails as the matrix expects), 1 a cell failed
# (lend failed, engine exited, reply differs, ... : the matrix's fail_on) or the shards' references
# disagree, 2 usage, 3 incomplete (a shard missing or cut short). `local` exits with the merge's status.
set -euo pipefail
cd "$(dirname "$0")/.."

MATRIX=${MATRIX:-ci/ci.toml}
OUT=${OUT:-matrix-ci}
PYTHON_GIVEN=${PYTHON:+yes}
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
read -r -a EXTRA <<<"${MATRIX_ARGS:-}"

usage() {
  sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

ci_files() {  # --junit/--summary flags for one step: its own files, and the CI page's summary when there is one
  local dir=$1
  printf '%s\n' --junit "$dir.junit.xml" --summary "$dir.summary.md"
}

step_summary() {  # copy a step's summary to the CI page
  if [ -n "${GITHUB_STEP_SUMMARY:-}" ] && [ -f "$1" ]; then cat "$1" >>"$GITHUB_STEP_SUMMARY"; fi
}

cmd_build() {
  if [ -n "$PYTHON_GIVEN" ]; then  # that interpreter has strata's dependencies: the engine alone
    cmake -S native -B build/native -DCMAKE_BUILD_TYPE=Release -DSTRATA_OUTPUT_DIR="$PWD/strata/lib" >/dev/null
    cmake --build build/native -j
  else  # the project's .venv and the engine
    make native
  fi
}

cmd_shard() {
  local k=$1 n=$2 dir="$OUT/shard-$1" rc=0
  mkdir -p "$OUT"
  rm -f "$dir.junit.xml" "$dir.summary.md"
  mapfile -t files < <(ci_files "$dir")
  "$PYTHON" -m repro_matrix run "$MATRIX" --out "$dir" --shard "$k/$n" --no-progress "${files[@]}" \
    ${EXTRA[@]+"${EXTRA[@]}"} || rc=$?
  step_summary "$dir.summary.md"
  echo "shard $k/$n: exit status $rc ($dir)" >&2
  return "$rc"
}

cmd_merge() {
  local n=$1 rc=0 dirs=()
  for k in $(seq 1 "$n"); do dirs+=("$OUT/shard-$k"); done
  rm -f "$OUT/merged.junit.xml" "$OUT/merged.summary.md"
  mapfile -t files < <(ci_files "$OUT/merged")
  "$PYTHON" -m repro_matrix merge "$OUT/merged" "${dirs[@]}" "${files[@]}" || rc=$?
  step_summary "$OUT/merged.summary.md"
  if [ -f "$OUT/merged/matrix.json" ]; then
    "$PYTHON" -m repro_matrix report "$OUT/merged" --output "$OUT/report.md" || true
  fi
  echo "merge of $n shards: exit status $rc (0 pass, 1 a cell failed, 2 usage, 3 incomplete)" >&2
  return "$rc"
}

cmd_local() {
  local n=$1 pids=() k
  mkdir -p "$OUT"
  for k in $(seq 1 "$n"); do
    cmd_shard "$k" "$n" >"$OUT/shard-$k.log" 2>&1 &
    pids+=($!)
  done
  for k in $(seq 1 "$n"); do
    wait "${pids[$((k - 1))]}" || true  # a shard's own failure is judged again by the merge
  done
  cmd_merge "$n"
}

case "${1:-}" in
  build) cmd_build ;;
  shard) [ $# -eq 3 ] || usage; cmd_shard "$2" "$3" ;;
  merge) [ $# -eq 2 ] || usage; cmd_merge "$2" ;;
  local) [ $# -eq 2 ] || usage; cmd_local "$2" ;;
  *) usage ;;
esac
