#!/bin/sh
# Build the project image from the wheelhouse (no package registry reached during the build).
#
#   scripts/docker_image.sh [TAG]                      default TAG: hfl:latest
#   BASE_IMAGE=local scripts/docker_image.sh           base made here with debootstrap (no container registry)
#   BASE_IMAGE=python:3.11-slim scripts/docker_image.sh   (the default; pulled from Docker Hub if missing)
#   NO_CACHE=1 ...                                     rebuild every layer (to time a cold build)
#
# Prints the build time and the image size on its last line.
set -eu
cd "$(dirname "$0")/.."
# One build at a time per checkout: two pytest-xdist workers (the compose and the edge-site tests) each build the
# image in their session fixture, and two wheelhouse copies and docker builds at once race on .wheelhouse.
mkdir -p .cache
exec 9>.cache/docker_image.lock
flock 9

TAG=${1:-hfl:latest}
BASE=${BASE_IMAGE:-python:3.11-slim}
scripts/wheelhouse.sh .wheelhouse
if [ "$BASE" = local ]; then
    BASE=hfl-base:bookworm
    scripts/docker_base.sh "$BASE"
fi
# the legacy builder where the buildx plugin is missing (Debian's docker.io client has none)
docker buildx version >/dev/null 2>&1 || export DOCKER_BUILDKIT=0
start=$(date +%s)
log=$(mktemp)
if ! docker build -f deploy/Dockerfile --build-arg BASE_IMAGE="$BASE" ${NO_CACHE:+--no-cache} -t "$TAG" . >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    rm -f "$log"
    echo "docker build failed" >&2
    exit 1
fi
rm -f "$log"
size=$(docker image inspect -f '{{.Size}}' "$TAG")
echo "built $TAG from $BASE in $(( $(date +%s) - start ))s; image size $(( size / 1000000 )) MB"
