#!/bin/sh
# Build a local base image without any container registry: debootstrap Debian bookworm (python3 3.11,
# python3-venv) from the Debian mirror apt already uses, then `docker import` it.
#
#   scripts/docker_base.sh [IMAGE]          default IMAGE: hfl-base:bookworm
#
# Cached: nothing is done when IMAGE exists; the root file system tarball is kept in
# ${HFL_CACHE:-.cache}/ so a fresh engine re-imports it in seconds instead of bootstrapping again.
# Needs root and debootstrap (apt-get install debootstrap). MIRROR overrides the mirror.
set -eu

IMAGE=${1:-hfl-base:bookworm}
SUITE=bookworm
CACHE=${HFL_CACHE:-.cache}
TARBALL="$CACHE/hfl-base-$SUITE.tar"
DOCKER=${DOCKER:-docker}

if $DOCKER image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "base image $IMAGE exists"
    exit 0
fi

if [ ! -s "$TARBALL" ]; then
    [ "$(id -u)" = 0 ] || { echo "debootstrap needs root" >&2; exit 1; }
    command -v debootstrap >/dev/null || { echo "debootstrap missing: apt-get install debootstrap" >&2; exit 1; }
    if [ -z "${MIRROR:-}" ]; then
        # the first Debian (not security) URI apt is configured with: deb822 sources or the classic list
        MIRROR=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | head -n1)
        [ -n "$MIRROR" ] || MIRROR=$(grep -hs '^deb ' /etc/apt/sources.list | awk '{print $2}' | grep -v security | head -n1)
        [ -n "$MIRROR" ] || MIRROR=http://deb.debian.org/debian
    fi
    mkdir -p "$CACHE"
    ROOT=$(mktemp -d "${TMPDIR:-/tmp}/hfl-rootfs.XXXXXX")
    trap 'rm -rf "$ROOT"' EXIT
    echo "debootstrap $SUITE from $MIRROR into $ROOT"
    debootstrap --variant=minbase --include=python3,python3-venv "$SUITE" "$ROOT" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 || {
        tail -n 30 "$CACHE/debootstrap.log" >&2; exit 1; }
    # slim it: no apt lists, caches, docs or man pages in the base
    rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/*.bin "$ROOT"/var/cache/apt/archives/*.deb \
           "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/usr/share/info/* "$ROOT"/usr/share/locale/*
    tar -C "$ROOT" --numeric-owner -cf "$TARBALL.tmp" .
    mv "$TARBALL.tmp" "$TARBALL"
fi

$DOCKER import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    "$TARBALL" "$IMAGE" >/dev/null
echo "base image $IMAGE imported from $TARBALL ($(du -h "$TARBALL" | cut -f1))"
