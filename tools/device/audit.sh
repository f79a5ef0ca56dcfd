#!/usr/bin/env bash
# Run ON the lent GPU machine, from the repository root, after tools/device/wheels.sh here:
#   device run: command "bash tools/device/audit.sh", carry [".whl"], timeout_s 570
# 1. installs the carried wheels into /tmp/site (the image keeps its own torch, numpy, pandas...);
# 2. audits the example profile with live measurements on the GPU (every chapter);
# 3. runs the GPU-marked tests (CUDA events, NVML samples, the allocator's peak vs the memory plan);
# 4. leaves in $OUT (at most 8 files come back): reference.tgz (findings.json, records/, the report's
#    pages), findings.json, audit.log, gpu-tests.log, nvidia-smi.csv, versions.txt.
# Then, here: python tools/device/keep_reference.py FOLDER-WITH-THOSE-FILES (-> data/reference/<chip>-<date>/).
# Exit code: the audit's (0 ran; 1 a chapter errored), 3 when the wheels do not install.
set -uo pipefail
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
OUT=${OUT:-/tmp/preflight-device-out}
WORK=${WORK:-/tmp/preflight-device}
AUDIT_TIMEOUT=${AUDIT_TIMEOUT:-420}          # seconds, the whole audit; the tests get what is left
mkdir -p "$OUT" && rm -rf "$WORK" && mkdir -p "$WORK"
t0=$SECONDS

"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl > "$OUT/install.log" 2>&1 || { tail -n 20 "$OUT/install.log"; exit 3; }
export PYTHONPATH="/tmp/site:$PWD/lib${PYTHONPATH:+:$PYTHONPATH}"
export JUPYTER_PATH=/tmp/site/share/jupyter PATH="/tmp/site/bin:$PATH"   # nbconvert's templates, kernel spec
echo "wheels installed in $((SECONDS - t0)) s"

{ "$PY" -c "import sys, torch, preflight; print('python', sys.version.split()[0]); print('torch', torch.__version__,
  'cuda', torch.version.cuda, 'available', torch.cuda.is_available()); print('preflight', preflight.__version__)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } > "$OUT/versions.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit \
  --format=csv > "$OUT/nvidia-smi.csv" 2>&1
cat "$OUT/versions.txt"

timeout -s INT -k 30 "$AUDIT_TIMEOUT" "$PY" -m preflight audit data/profiles/example.yaml --out "$WORK/report" \
  --timeout "$AUDIT_TIMEOUT" 2>&1 | tee "$OUT/audit.log"
audit_rc=${PIPESTATUS[0]}
echo "audit exit $audit_rc after $((SECONDS - t0)) s"

timeout 150 "$PY" -m pytest -q -rs -m gpu -p no:cacheprovider tests/test_baseline.py tests/test_ceilings.py \
  tests/test_memory_bench.py tests/test_nvml.py > "$OUT/gpu-tests.log" 2>&1
echo "GPU tests exit $? after $((SECONDS - t0)) s:"; tail -n 15 "$OUT/gpu-tests.log"

if [ -f "$WORK/report/findings.json" ]; then
  cp "$WORK/report/findings.json" "$OUT/findings.json"
  tar czf "$OUT/reference.tgz" -C "$WORK/report" --exclude notebooks .
fi
ls -la "$OUT"
exit "$audit_rc"
