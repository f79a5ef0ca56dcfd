#!/usr/bin/env bash
# Run HERE (with network), before a session's one device run: the wheels the GPU machine's image lacks
# for the audit, into .whl/ at the repository root (git-ignored; name it in the device call's `carry`).
#   tools/device/wheels.sh [PYVER]      # PYVER: the image's Python, 3.12 by default
# Downloads the audit's pins (all but torch, kept from the image, and the browser/lab/test tools) with
# their dependencies, then drops every package image-packages.txt says the image already has.
# The device tool carries at most 64 MiB with the repository: the total is printed and checked.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYVER=${1:-3.12}
PYTHON=${PYTHON:-python3}
rm -rf .whl && mkdir -p .whl
"$PYTHON" tools/pins.py --without torch --without jupyterlab --without playwright --without pytest \
  --without hypothesis > .whl/requirements.txt
"$PYTHON" -m pip download -q --only-binary=:all: --python-version "$PYVER" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl -r .whl/requirements.txt 2>&1 | grep -v '^WARNING: Location' || true
has=$(grep -v '^#' tools/device/image-packages.txt | tr ' ' '\n' | sed '/^$/d')
for whl in .whl/*.whl; do
  name=$(basename "$whl" | cut -d- -f1 | tr 'A-Z_' 'a-z-')
  if grep -qx "$name" <<< "$has"; then rm "$whl"; fi
done
rm .whl/requirements.txt
mb=$(du -sm .whl | cut -f1)
echo "$(ls .whl | wc -l) wheels, ${mb} MB in .whl/ for Python $PYVER"
if [ "$mb" -gt 60 ]; then echo "over 60 MB: the device call carries 64 MiB with the repository" >&2; exit 1; fi
