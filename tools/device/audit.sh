#!/usr/bin/env bash
# Run ON the lent GPU machine, from the repository root, after tools/device/wheels.sh here:
#   device run: command "bash tools/device/audit.sh", carry [".whl"], timeout_s 600
#
# One shot that always returns what it measured. Every phase runs under its own timeout, cut to what
# is left of BUDGET (default 560 s, under the call's 600 s), so the timeouts add up to less than the
# call's limit by construction; each measurement writes its record as it is made, and everything made
# so far is packed into $OUT/reference.tgz after every phase (a SIGKILL at the call's limit loses at
# most the phase in flight). Phases, the GPU first:
#   0. setup (<= 20 s): the carried wheels into /tmp/site (the image keeps its torch), the import smoke
#      test at the pinned versions (tools/device/smoke.py) and `preflight check` of the example
#      profile; a failure stops the run here, and says why;
#   1. the measurements that need the GPU, each its own command writing its record (JSON) into
#      records/: matmul / memory ceilings, the reference model's baseline (op categories, MFU,
#      memory), the memory planner against the allocator, torch.compile fusion, chapter 4's padding vs
#      bucketing; torch.profiler traces of the reference model's and a workload's training steps;
#   2. the GPU-marked tests (CUDA events, NVML, the allocator's peak against the plan);
#   3. the audit of every chapter with what is left, reading phase 1's records (--results), so it
#      measures only the rest (chapter 2's loader on the GPU; chapters 3-5 run on the CPU over gloo
#      with one GPU, and their records say so: keep_reference.py drops them).
# $OUT, 8 files (the device tool brings back at most 8): reference.tgz, phases.log, versions.txt,
# nvidia-smi.csv, setup.log, benches.log, gpu-tests.log, audit.log.
# Then, here: python tools/device/keep_reference.py FOLDER (-> data/reference/<chip>-<date>/).
#
# Rehearsal on the CPU (the suite runs it, tests/test_device_tools.py):
#   PY=.venv/bin/python WHEELS=none QUICK=1 BUDGET=90 PHASES="ceilings audit" OUT=/tmp/out bash tools/device/audit.sh
# (the audit is stopped by its timeout half-way; reference.tgz holds every record made until then).
# Environment: PY (python3), OUT, WORK (/tmp/preflight-device), BUDGET (s), WHEELS (none: use PY's own
# packages), QUICK (1: the benches' smallest sizes), PHASES (all, or the names of some phases).
# Exit code: 0 every phase ran; 3 setup failed (nothing measured); 4 a later phase failed or timed out.
set -uo pipefail
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
OUT=${OUT:-/tmp/preflight-device-out}
WORK=${WORK:-/tmp/preflight-device}
BUDGET=${BUDGET:-560}
RESERVE=15                                      # seconds kept for the last packing
QUICK=${QUICK:-0}
PHASES=${PHASES:-all}                           # or some of: ceilings baseline memory padding traces-reference
                                                # traces-workload fusion gpu-tests audit
q=(); [ "$QUICK" = 1 ] && q=(--quick)
mkdir -p "$OUT" && rm -rf "$WORK" && mkdir -p "$WORK/records" "$WORK/traces"
LOG="$OUT/phases.log"
: > "$LOG"
failed=0

say() { echo "[$(printf '%4d' "$SECONDS") s] $*" | tee -a "$LOG"; }

pack() {     # everything measured so far, atomically: a half-written tarball never replaces a whole one
  tar czf "$OUT/.reference.tgz" -C "$WORK" --exclude notebooks --exclude '*.html' --exclude '*.ipynb' \
    --exclude '.cache' . 2> /dev/null && mv "$OUT/.reference.tgz" "$OUT/reference.tgz"
}

# phase NAME CAP LOGFILE CMD...: run CMD under min(CAP, what is left of BUDGET - RESERVE) seconds
# (SIGINT first, SIGKILL 10 s later), append its output to LOGFILE, log its exit code, pack.
phase() {
  local name=$1 cap=$2 log=$3; shift 3
  if [ "$PHASES" != all ] && [ "$name" != smoke ] && ! grep -qw -- "$name" <<< "$PHASES"; then return 0; fi
  local left=$((BUDGET - RESERVE - SECONDS))
  local t=$(( cap < left ? cap : left ))
  if [ "$t" -lt 5 ]; then say "$name: skipped, ${left} s left of the ${BUDGET} s budget"; failed=1; return 124; fi
  say "$name: start (timeout ${t} s)"
  echo "### $name: $*" >> "$log"
  timeout -s INT -k 10 "$t" "$@" >> "$log" 2>&1
  local rc=$?
  case $rc in
    0) say "$name: ok" ;;
    124|137) say "$name: TIMED OUT after ${t} s (what it wrote so far is packed)"; failed=1 ;;
    *) say "$name: exit $rc (see $(basename "$log"))"; failed=1 ;;
  esac
  pack
  return $rc
}
trap 'pack; say "packed $(du -h "$OUT/reference.tgz" 2> /dev/null | cut -f1) in reference.tgz"' EXIT

# --- 0. setup: wheels, imports, check (seconds) -------------------------------------------------------
if [ "${WHEELS:-}" != none ]; then
  if ! ls .whl/*.whl > /dev/null 2>&1; then say "setup: no .whl/ (run tools/device/wheels.sh here first)"; exit 3; fi
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl > "$OUT/setup.log" 2>&1 || { say "setup: the wheels did not install"; tail -n 20 "$OUT/setup.log"; exit 3; }
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  export JUPYTER_PATH=/tmp/site/share/jupyter PATH="/tmp/site/bin:$PATH"   # nbconvert's templates, kernel spec
  say "setup: wheels installed"
fi
export PYTHONPATH="$PWD/lib${PYTHONPATH:+:$PYTHONPATH}"
phase smoke 20 "$OUT/setup.log" "$PY" tools/device/smoke.py || { say "setup: an import failed, stop"; exit 3; }
grep -E '^(preflight|FAIL|DIFF)' "$OUT/setup.log" | tee "$OUT/versions.txt" >> "$LOG"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit \
  --format=csv > "$OUT/nvidia-smi.csv" 2>&1 || echo "nvidia-smi: not available" > "$OUT/nvidia-smi.csv"
# check exits 0 (no --fail-on) or 1; 2 or more is a broken install or profile.
timeout 20 "$PY" -m preflight check data/profiles/example.yaml >> "$OUT/setup.log" 2>&1
rc=$?; if [ "$rc" -gt 1 ]; then say "setup: preflight check exit $rc, stop"; exit 3; fi
say "setup: preflight check ran (exit $rc)"

# --- 1. what needs the GPU, one command and one record each --------------------------------------------
R="$WORK/records"
B="$OUT/benches.log"
phase ceilings 60 "$B" "$PY" -m preflight.bench.ceilings --out "$R" "${q[@]}"
phase baseline 90 "$B" "$PY" -m preflight.bench.baseline --out "$R" "${q[@]}"
phase memory 60 "$B" "$PY" -m preflight.bench.memory --out "$R" "${q[@]}"
phase padding 60 "$B" "$PY" -m preflight.bench.padding --out "$R" "${q[@]}"
phase traces-reference 60 "$B" "$PY" -m preflight.bench.traces --out "$WORK/traces" --steps 3 "${q[@]}"
phase traces-workload 60 "$B" "$PY" -m preflight.bench.traces --out "$WORK/traces" --steps 3 \
  --workload examples/small_cnn.py:build
phase fusion 120 "$B" "$PY" -m preflight.bench.fusion --out "$R" "${q[@]}"    # a cold torch.compile

# --- 2. the GPU tests ----------------------------------------------------------------------------------
phase gpu-tests 90 "$OUT/gpu-tests.log" "$PY" -m pytest -q -rs -m gpu -p no:cacheprovider tests/test_baseline.py \
  tests/test_ceilings.py tests/test_memory_bench.py tests/test_nvml.py

# --- 3. the audit with what is left (phase 1's records are read, not measured again) -------------------
# The profile says gpu: auto (this machine): records are matched to the profile's GPU, and phase 1's
# were measured here, whichever chip the call got (an H100 or an H200).
sed -E 's/^(\s+gpu:\s*)\S+/\1auto/' data/profiles/example.yaml > "$WORK/example-this-gpu.yaml"
left=$((BUDGET - RESERVE - SECONDS - 5))
if [ "$PHASES" != all ] && ! grep -qw audit <<< "$PHASES"; then
  :
elif [ "$left" -ge 30 ]; then
  audit=("$PY" -m preflight audit "$WORK/example-this-gpu.yaml" --out "$WORK/report" --results "$R" --timeout "$left")
  [ "$QUICK" = 1 ] && audit+=(--quick)
  phase audit "$left" "$OUT/audit.log" "${audit[@]}"
else
  say "audit: skipped, ${left} s left of the ${BUDGET} s budget"; failed=1
fi
say "done: $( [ $failed = 0 ] && echo 'every phase ran' || echo 'a phase failed or timed out (above)')"
ls -la "$OUT" >> "$LOG"
exit $(( failed ? 4 : 0 ))
