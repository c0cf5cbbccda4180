#!/usr/bin/env bash
# The verification runs of a GPU session, in parts that each fit one 10-minute device call:
#
#   benchmarks/device_session.sh tests [PATH ...]  # pytest -q tests (CPU tests, compile tests, tests/gpu),
#                                                   # or only the given test files
#   benchmarks/device_session.sh sanitize [VARIANT ...]  # compute-sanitizer memcheck, racecheck, synccheck on benchmarks.smoke
#                                                   # (--configs: each compiled configuration of day 16 forced)
#   benchmarks/device_session.sh bench [SUITE ...]  # the committed CSVs: quick seed depthwise edge
#                                                   # resnet50_fp32 resnet50_fp32_NHWC resnet50_fp16_NHWC
#                                                   # resnet50_dgrad_fp16_NHWC resnet50_wgrad_fp16_NHWC (default: all)
#   benchmarks/device_session.sh notebooks [notebooks/day_NN_*.ipynb ...]   # re-execute in place
#   benchmarks/device_session.sh train [--batch N]   # day 14's training step on each kernel set vs torch
#   benchmarks/device_session.sh tune [SUITE ...]   # day 15's CSVs: per SUITE (default: resnet50 outside) a cold
#                                                   # tune with the exhaustive sweep, then a warm rerun;
#                                                   # VARIANTS="a b" tunes only those, SWEEP=0 skips the sweep
#
# e.g. after the day 12 / day 13 split (day 12 = igemm_pipelined, day 13 = igemm_production):
#   benchmarks/device_session.sh tests tests/gpu/test_pipelined_gpu.py tests/gpu/test_production_gpu.py
#   benchmarks/device_session.sh sanitize igemm_pipelined igemm_production
#   benchmarks/device_session.sh bench quick seed edge resnet50_fp16_NHWC   # the CSVs with tensor-core rows
#
# Logs go to $OUT (default ./out); a part that fails is logged and the next command still runs.
# Results land where the commands write them (benchmarks/results/<gpu>/, notebooks/); the part
# ends by packing them with the logs into $OUT/<part>.tar.gz. Exit status: 1 if any command failed.
set -uo pipefail
cd "$(dirname "$0")/.."
part=${1:?usage: benchmarks/device_session.sh tests|sanitize|bench|notebooks|train|tune [...]}
shift
out=${OUT:-out}
mkdir -p "$out"
status=0
export PYTHONUNBUFFERED=1

# Every step of a part ends by the part's deadline (PART_LIMIT seconds from the start, default
# 540: a device call is cut at 600 s, and a call cut short returns no files), so the part always
# packs what it has: a step cut by the deadline exits 124, a step after it does not run.
deadline=$((SECONDS + ${PART_LIMIT:-540}))

step() {  # step NAME COMMAND...: run, log to $out/NAME.log, remember a failure
  local name=$1
  shift
  echo "== $name: $*"
  local t0=$SECONDS left=$((deadline - SECONDS))
  if [ $left -le 5 ]; then
    echo "   skipped: the part's deadline (PART_LIMIT) has passed" | tee "$out/$name.log"
    status=1
    return
  fi
  timeout "$left" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc in $((SECONDS - t0)) s (log: $out/$name.log)"
  tail -n 3 "$out/$name.log"
  [ $rc -eq 0 ] || status=1
}

case "$part" in
  tests)
    step pytest python3 -m pytest -q "${@:-tests}" -p no:cacheprovider --junitxml="$out/pytest.xml"
    ;;
  sanitize)
    variants=()
    [ $# -gt 0 ] && variants=(--variants "$@")
    step memcheck compute-sanitizer --tool memcheck --error-exitcode 1 python3 -m benchmarks.smoke --configs "${variants[@]}"
    step racecheck compute-sanitizer --tool racecheck --error-exitcode 1 python3 -m benchmarks.smoke --configs "${variants[@]}"
    step synccheck compute-sanitizer --tool synccheck --error-exitcode 1 python3 -m benchmarks.smoke --configs "${variants[@]}"
    ;;
  bench)
    suites=("$@")
    [ ${#suites[@]} -gt 0 ] || suites=(quick seed depthwise edge resnet50_fp32 resnet50_fp32_NHWC resnet50_fp16_NHWC
                                       resnet50_dgrad_fp16_NHWC resnet50_wgrad_fp16_NHWC)
    for s in "${suites[@]}"; do
      case "$s" in
        quick | seed | depthwise | edge) step "$s" python3 -m benchmarks --suite "$s" --no-progress ;;
        resnet50_fp32) step "$s" python3 -m benchmarks --suite resnet50 --dtype fp32 --layout NCHW --no-progress \
          --variants blocked general winograd_f2 winograd_f4 winograd_f2_fused winograd_f4_fused ;;
        resnet50_fp32_NHWC) step "$s" python3 -m benchmarks --suite resnet50 --dtype fp32 --layout NHWC --no-progress ;;
        resnet50_fp16_NHWC) step "$s" python3 -m benchmarks --suite resnet50 --dtype fp16 --layout NHWC --no-progress ;;
        resnet50_dgrad_fp16_NHWC | resnet50_wgrad_fp16_NHWC)  # day 14: the backward operations
          op=${s#resnet50_}
          step "$s" python3 -m benchmarks --suite resnet50 --op "${op%%_*}" --dtype fp16 --layout NHWC --no-progress ;;
        *) echo "unknown suite $s" >&2; status=1 ;;
      esac
    done
    ;;
  notebooks)
    step notebooks python3 -m benchmarks.notebooks "$@"
    ;;
  train)
    step train python3 -m benchmarks.train_step "$@"
    ;;
  tune)
    cache="$out/tune_cache.json"
    rm -f "$cache"
    PYCUDA_CACHE_DIR=$(mktemp -d)  # cold: no cubin of an earlier part (the tests build every tile) answers
    export PYCUDA_CACHE_DIR
    opts=()
    [ -n "${VARIANTS:-}" ] && read -ra v <<<"$VARIANTS" && opts+=(--variants "${v[@]}")
    warm=("${opts[@]}")
    [ "${SWEEP:-1}" = 0 ] || opts+=(--exhaustive)
    suites=("$@")
    [ ${#suites[@]} -gt 0 ] || suites=(resnet50 outside)
    for s in "${suites[@]}"; do
      step "tune_$s" python3 -m benchmarks.tune --suite "$s" "${opts[@]}" --cache "$cache" --no-progress
      step "tune_${s}_warm" python3 -m benchmarks.tune --suite "$s" "${warm[@]}" --cache "$cache" \
        --no-cudnn --no-progress \
        --out "$out/warm"
    done
    ;;
  *)
    echo "unknown part $part: tests, sanitize, bench, notebooks, train or tune" >&2
    exit 2
    ;;
esac
tar -czf "$out/$part.tar.gz" "$out"/*.log $( [ -f "$out/pytest.xml" ] && echo "$out/pytest.xml" ) \
  $( [ -d "$out/warm" ] && echo "$out/warm" ) $( [ -f "$out/tune_cache.json" ] && echo "$out/tune_cache.json" ) \
  benchmarks/results notebooks 2>/dev/null
echo "packed $out/$part.tar.gz; status $status"
exit $status
