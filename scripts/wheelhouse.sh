#!/bin/sh
# Download every wheel the image needs into a wheelhouse, so `docker build` never reaches a registry:
# the Dockerfile installs with `pip install --no-index --find-links` from this directory only.
#
#   scripts/wheelhouse.sh [DIR]                     default DIR: .wheelhouse (the build context's copy)
#
# The dependencies are read from pyproject.toml ([project] dependencies and [build-system] requires)
# into DIR/requirements.txt. Wheels are chosen for the image, not for this machine: CPython 3.11 on
# manylinux x86_64 (ARCH=aarch64 for arm64 hosts), binary wheels only.
#
# torch: the image must get the CPU build (the default PyPI torch wheel for Linux pulls several GB of
# CUDA libraries). pip resolves torch==2.13.0 from whatever indexes and find-links pip is configured with;
# where that is not a CPU wheel, point TORCH_INDEX at the CPU index:
#   TORCH_INDEX=https://download.pytorch.org/whl/cpu scripts/wheelhouse.sh
# The script refuses a torch wheel that requires nvidia-* packages.
#
# Cached: when DIR/.complete matches the requirements and platform, nothing is downloaded.
set -eu

WH=${1:-.wheelhouse}
PY=${PYTHON:-python3}
ARCH=${ARCH:-x86_64}
GLIBC=${GLIBC:-2_36}   # Debian bookworm (the base images); pip also accepts every older manylinux tag
# every manylinux tag a glibc-2.${GLIBC#2_} system accepts (pip does not expand --platform by itself)
PLATFORM="--python-version 3.11 --implementation cp --abi cp311 --only-binary=:all:"
for y in $(seq "${GLIBC#2_}" -1 5); do PLATFORM="$PLATFORM --platform manylinux_2_${y}_${ARCH}"; done
PLATFORM="$PLATFORM --platform manylinux2014_${ARCH} --platform manylinux2010_${ARCH} --platform manylinux1_${ARCH}"

mkdir -p "$WH"
"$PY" - "$WH/requirements.txt" <<'PYEOF'
import sys, tomllib
meta = tomllib.load(open("pyproject.toml", "rb"))
reqs = list(meta["project"]["dependencies"]) + list(meta["build-system"]["requires"]) + ["wheel"]
open(sys.argv[1], "w").write("\n".join(reqs) + "\n")
PYEOF

# Full Fashion-MNIST for the image (issue 19): the Debian package's files, when this machine has them
# (apt-get install dataset-fashion-mnist); the Dockerfile keeps them under /opt/hfl/share/datasets.
FMNIST=${FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
if [ -f "$FMNIST/train-images-idx3-ubyte.gz" ] && [ ! -d "$WH/datasets/fashion-mnist" ]; then
    mkdir -p "$WH/datasets/fashion-mnist" && cp "$FMNIST"/*-ubyte.gz "$WH/datasets/fashion-mnist/"
fi

STAMP="$(cat "$WH/requirements.txt") $PLATFORM ${TORCH_INDEX:-}"
if [ -f "$WH/.complete" ] && [ "$(cat "$WH/.complete")" = "$STAMP" ]; then
    echo "wheelhouse $WH is up to date ($(ls "$WH"/*.whl | wc -l) wheels, $(du -sh "$WH" | cut -f1))"
    exit 0
fi
rm -f "$WH/.complete"

EXTRA=""
[ -n "${TORCH_INDEX:-}" ] && EXTRA="--extra-index-url $TORCH_INDEX"
# shellcheck disable=SC2086
"$PY" -m pip download --disable-pip-version-check -q --progress-bar off -d "$WH" $PLATFORM $EXTRA -r "$WH/requirements.txt"

"$PY" - "$WH" <<'PYEOF'
import pathlib, sys, zipfile
wh = pathlib.Path(sys.argv[1])
torches = sorted(wh.glob("torch-*.whl"))
if not torches:
    sys.exit("no torch wheel in the wheelhouse")
for whl in torches:
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        cuda = [l for l in z.read(meta).decode().splitlines() if l.startswith("Requires-Dist: nvidia-")]
    if cuda:
        whl.unlink()
        sys.exit(f"{whl.name} is a CUDA build ({len(cuda)} nvidia-* requirements); "
                 "rerun with TORCH_INDEX=https://download.pytorch.org/whl/cpu")

print(f"torch: {torches[-1].name} ({torches[-1].stat().st_size >> 20} MiB, CPU build)")
PYEOF

printf '%s' "$STAMP" > "$WH/.complete"
echo "wheelhouse $WH: $(ls "$WH"/*.whl | wc -l) wheels, $(du -sh "$WH" | cut -f1)"
