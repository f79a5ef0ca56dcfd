#!/usr/bin/env bash
# Run HERE (with network), before a session's one device run: the wheels the GPU machine's image lacks
# for the audit, into .whl/ at the repository root (git-ignored; name it in the device call's `carry`).
#   tools/device/wheels.sh [PYVER]      # PYVER: the image's Python, 3.12 by default
# Downloads the audit's pins (all but torch, kept from the image, and the browser/lab/test tools) with
# their dependencies, then drops what image-packages.txt says the image already has: a pinned package
# only at the pinned version, a dependency by name. A failed download fails here.
# The device tool carries at most 64 MiB with the repository: the total is printed and checked.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYVER=${1:-3.12}
PYTHON=${PYTHON:-python3}
rm -rf .whl && mkdir -p .whl
"$PYTHON" tools/pins.py --without torch --without jupyterlab --without playwright --without pytest \
  --without pytest-xdist --without hypothesis --without ruff > .whl/requirements.txt
# A failed download stops here, with pip's reason (not minutes into the device run).
if ! "$PYTHON" -m pip download -q --only-binary=:all: --python-version "$PYVER" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl -r .whl/requirements.txt > .whl/download.log 2>&1; then
  grep -v '^WARNING: Location' .whl/download.log | tail -n 15 >&2
  echo "wheels.sh: pip download failed for Python $PYVER (above)" >&2; exit 1
fi
rm .whl/download.log
# Drop what the image already has. A pinned package (the audit's own requirement) is dropped only where
# the image holds that very version (image-packages.txt, name==version); a dependency of one by name.
norm() { tr 'A-Z_' 'a-z-'; }
pinned=$(sed -E 's/[<>=!~;[ ].*//' .whl/requirements.txt | norm)
has_name=$(grep -v '^#' tools/device/image-packages.txt | tr ' ' '\n' | sed '/^$/d; s/==.*//' | norm)
has_pin=$(grep -v '^#' tools/device/image-packages.txt | tr ' ' '\n' | grep '==' | norm)
# Left to the image, said here: numpy (the image has 2.5.2, the pin 2.4.6: the library uses no API that
# differs between them; 16.6 MB that would not fit); debugpy and jedi, which ipykernel and IPython
# import only if present (a kernel ran a papermill notebook without them here, 2026-12-05; 10 MB).
# tools/device/smoke.py names every version that differs from its pin in the run's first seconds.
IMAGE_SERVES="numpy debugpy jedi"
for whl in .whl/*.whl; do
  base=$(basename "$whl")
  name=$(cut -d- -f1 <<< "$base" | norm)
  version=$(cut -d- -f2 <<< "$base")
  if grep -qwx "$name" <<< "$(tr ' ' '\n' <<< "$IMAGE_SERVES")"; then
    rm "$whl"
  elif grep -qx "$name" <<< "$pinned"; then
    if grep -qx "$name==$version" <<< "$has_pin"; then rm "$whl"; fi
  elif grep -qx "$name" <<< "$has_name"; then
    rm "$whl"
  fi
done
rm .whl/requirements.txt
mb=$(du -sm .whl | cut -f1)
echo "$(ls .whl | wc -l) wheels, ${mb} MB in .whl/ for Python $PYVER"
if [ "$mb" -gt 60 ]; then echo "over 60 MB: the device call carries 64 MiB with the repository" >&2; exit 1; fi
