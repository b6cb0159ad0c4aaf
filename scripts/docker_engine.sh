#!/bin/sh
# Make sure a Docker Engine answers, installing and starting one if needed; stop only an engine we started.
#
#   scripts/docker_engine.sh start     exit 0: an engine answers (ours or one that was already running)
#                                      exit 3: this machine cannot run one (not root, no apt, dockerd refuses)
#   scripts/docker_engine.sh stop      stop the engine `start` launched, if any (never someone else's)
#
# start: when `docker info` fails, installs Debian's docker.io and docker-compose (and debootstrap, for
# the registry-free base image) with apt-get, then runs dockerd in the background with the overlay2
# storage driver, falling back to vfs (much slower container starts) when overlay2 cannot start a
# container. Images stay in /var/lib/docker between runs: the cache of base image, layers and image.
set -u

STATE=${HFL_ENGINE_STATE:-/run/hfl-dockerd}
PIDFILE=$STATE/dockerd.pid
LOG=$STATE/dockerd.log

cannot() { echo "cannot run a Docker Engine here: $*" >&2; exit 3; }

answers() { docker info >/dev/null 2>&1; }

have_compose() { docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null; }

wait_engine() {  # $1: dockerd pid
    i=0
    while [ $i -lt 60 ]; do
        answers && return 0
        kill -0 "$1" 2>/dev/null || return 1
        sleep 1; i=$((i + 1))
    done
    return 1
}

probe_image() {  # a tiny image made from this machine's /bin/true and its libraries: no registry needed
    docker image inspect hfl-probe:latest >/dev/null 2>&1 && return 0
    dir=$(mktemp -d)
    mkdir -p "$dir/bin"
    cp /bin/true "$dir/bin/true"
    for lib in $(ldd /bin/true | grep -o '/[^ ]*'); do
        mkdir -p "$dir$(dirname "$lib")"
        cp -L "$lib" "$dir$lib"
    done
    tar -C "$dir" -c . | docker import - hfl-probe:latest >/dev/null
    rm -rf "$dir"
}

stop_ours() {
    [ -f "$PIDFILE" ] || return 0
    pid=$(cat "$PIDFILE")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        i=0
        while kill -0 "$pid" 2>/dev/null && [ $i -lt 30 ]; do sleep 1; i=$((i + 1)); done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    fi
    rm -f "$PIDFILE"
    # the default bridge outlives dockerd; ours goes with it
    command -v ip >/dev/null && ip link show docker0 >/dev/null 2>&1 && ip link delete docker0 2>/dev/null
    return 0
}

case "${1:-start}" in
start)
    if answers; then
        echo "a Docker Engine answers already"
        exit 0
    fi
    [ "$(uname -s)" = Linux ] || cannot "not Linux"
    [ "$(id -u)" = 0 ] || cannot "no engine answers, and installing and starting one needs root"
    if ! command -v dockerd >/dev/null || ! have_compose || ! command -v debootstrap >/dev/null; then
        command -v apt-get >/dev/null || cannot "no dockerd, and no apt-get to install docker.io"
        echo "installing docker.io docker-compose debootstrap with apt-get"
        { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
              docker.io docker-compose debootstrap; } >"${TMPDIR:-/tmp}/hfl-apt.log" 2>&1 \
            || { tail -n 20 "${TMPDIR:-/tmp}/hfl-apt.log" >&2; cannot "apt-get could not install docker.io"; }
    fi
    stop_ours
    mkdir -p "$STATE"
    : > "$LOG"
    for driver in overlay2 vfs; do
        setsid dockerd --storage-driver "$driver" >>"$LOG" 2>&1 < /dev/null &  # outlives this script
        pid=$!
        echo "$pid" > "$PIDFILE"
        if wait_engine "$pid"; then
            probe_image
            if docker run --rm --network none hfl-probe:latest /bin/true >>"$LOG" 2>&1; then
                echo "dockerd started (pid $pid, storage driver $driver, log $LOG)"
                exit 0
            fi
        fi
        echo "dockerd with $driver could not start a container; see $LOG" >&2
        stop_ours
    done
    tail -n 20 "$LOG" >&2
    cannot "dockerd does not start containers (log: $LOG)"
    ;;
stop)
    stop_ours
    ;;
*)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
