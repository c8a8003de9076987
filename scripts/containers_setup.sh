#!/usr/bin/env bash
# Container runtime for Tidewatch's integration tests and docker-compose.yml on a
# machine without a Docker engine and without a reachable container registry:
# Podman from Debian serving the Docker API, a Debian base image made with
# debootstrap, and the project's images built from containers/*/Containerfile.
#
# Usage:  scripts/containers_setup.sh [setup [--keep-service]|start|stop|status|images]
#   setup   (default) everything below, idempotent and cached.  An API service it had
#           to start is checked and stopped again at the end (tests/containers.py starts
#           one on demand), unless --keep-service (PID in .run/podman-service.pid)
#   start   only start the Podman API service if its socket is not answering
#   stop    stop the API service this script started (by its PID file)
#   status  say what is installed / running / built
#   images  only (re)build the images that are out of date
#
# Every step is skipped when its result is already there: packages installed,
# config identical, socket answering, base image present, project images whose
# "tidewatch.inputs" label equals the hash of their inputs (Containerfile,
# context files, base image id, Kafka jars).  Users with Docker do not need this
# script: `docker compose up --build` builds from the public debian:bookworm-slim.
#
# Environment: TIDEWATCH_PODMAN_SOCKET (default /run/podman/podman.sock),
# TIDEWATCH_KAFKA_VERSION (default: the kafka_version setting), TIDEWATCH_CACHE_DIR (the jars, as
# python -m tidewatch.jars; default .cache), TIDEWATCH_CONTAINERS_CACHE
# (default .cache/containers: the debootstrap root file system).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUN_DIR="$ROOT/.run"
CACHE_DIR="${TIDEWATCH_CONTAINERS_CACHE:-$ROOT/.cache/containers}"
SOCKET="${TIDEWATCH_PODMAN_SOCKET:-/run/podman/podman.sock}"
PID_FILE="$RUN_DIR/podman-service.pid"
BASE_IMAGE="localhost/tidewatch-base:bookworm"
CONF=/etc/containers/containers.conf

STARTED_SERVICE=0

log() { printf '[containers] %s\n' "$*" >&2; }
die() { printf '[containers] error: %s\n' "$*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        die "needs root for: $* (run as root or install sudo)"
    fi
}

# the two settings the images are built from, asked of one Python (each start costs about a
# second): "KAFKA_VERSION CACHE_DIR" -- the kafka_version setting (TIDEWATCH_KAFKA_VERSION first)
# and the cache_dir setting (TIDEWATCH_CACHE_DIR, default .cache), where python -m tidewatch.jars
# puts the Kafka and Spark jars; without the .venv, read from settings.py and the environment
image_settings() {
    local answer=""
    if [ -x "$ROOT/.venv/bin/python" ]; then
        answer="$(cd "$ROOT" && .venv/bin/python -c 'from tidewatch.settings import get_settings; s = get_settings(); print(s.kafka_version, s.cache_dir.resolve())' 2>/dev/null)" || answer=""
    fi
    if [ -z "$answer" ]; then
        answer="${TIDEWATCH_KAFKA_VERSION:-$(sed -n 's/^ *kafka_version: str = "\(.*\)"/\1/p' "$ROOT/tidewatch/settings.py" | head -1)} $(cd "$ROOT" && realpath -m "${TIDEWATCH_CACHE_DIR:-.cache}")"
    fi
    echo "$answer"
}

# --- 1. packages ------------------------------------------------------------------
PACKAGES=(podman runc netavark aardvark-dns slirp4netns uidmap fuse-overlayfs iptables podman-compose debootstrap curl)

install_packages() {
    local missing=()
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    if [ ${#missing[@]} -eq 0 ]; then log "packages: present"; return; fi
    log "packages: installing ${missing[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || {
        as_root apt-get update >/dev/null
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
    }
}

# --- 2. containers.conf -----------------------------------------------------------
# runc, because crun fails on these hosts' hybrid cgroups; a nofile limit Kafka and
# PostgreSQL are happy with; netavark (with aardvark-dns: compose service names resolve),
# not the CNI plugins Podman falls back to when it finds a CNI config and no choice.
write_conf() {
    local want
    want=$'# written by tidewatch scripts/containers_setup.sh\n[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]\n\n[engine]\nruntime = "runc"\n\n[network]\nnetwork_backend = "netavark"\n'
    if [ -f "$CONF" ] && [ "$(cat "$CONF")" = "$(printf '%s' "$want")" ]; then log "config: $CONF up to date"; return; fi
    if [ -f "$CONF" ] && ! grep -q 'tidewatch' "$CONF"; then
        log "config: keeping the existing $CONF as $CONF.before-tidewatch"
        as_root cp -n "$CONF" "$CONF.before-tidewatch"
    fi
    as_root mkdir -p "$(dirname "$CONF")"
    printf '%s' "$want" | as_root tee "$CONF" >/dev/null
    log "config: wrote $CONF"
}

# --- 3. the Docker-API service ------------------------------------------------------
socket_answers() {
    [ -S "$SOCKET" ] && curl -fsS --max-time "${1:-5}" --unix-socket "$SOCKET" http://d/_ping >/dev/null 2>&1
}

# Something accepts connections on the socket (maybe too busy to answer a ping in time).
# Never start a second service then: a new one re-binds the path, and when either exits
# Podman unlinks the socket file under the other one.
socket_listening() {
    [ -S "$SOCKET" ] || return 1
    local rc=0
    curl -sS --max-time 2 --unix-socket "$SOCKET" http://d/_ping >/dev/null 2>&1 || rc=$?
    [ "$rc" != 7 ]  # 7: could not connect
}

start_service() {
    if socket_answers 5; then log "service: $SOCKET answers"; return; fi
    if socket_listening; then
        log "service: $SOCKET accepts connections but is slow; waiting for it"
        for _ in $(seq 1 12); do socket_answers 10 && { log "service: $SOCKET answers"; return; }; done
        die "the service on $SOCKET does not answer; not starting a second one"
    fi
    mkdir -p "$RUN_DIR" "$(dirname "$SOCKET")"
    log "service: starting podman system service on unix://$SOCKET"
    # from /, not this checkout: the service outlives it (later checkouts reuse it), and a service
    # whose working directory was deleted answers but fails every container start ("write child:
    # broken pipe"); exec keeps $! the service's PID
    (cd / && exec setsid podman system service --time=0 "unix://$SOCKET" >"$RUN_DIR/podman-service.log" 2>&1 </dev/null) &
    echo $! >"$PID_FILE"
    STARTED_SERVICE=1
    for _ in $(seq 1 150); do socket_answers 5 && { log "service: up (pid $(cat "$PID_FILE"))"; return; }; sleep 0.2; done
    die "podman system service did not answer on $SOCKET; see $RUN_DIR/podman-service.log"
}

stop_service() {
    if [ ! -f "$PID_FILE" ]; then log "service: no PID file, nothing started by us"; return; fi
    local pid
    pid="$(cat "$PID_FILE")"
    if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q 'podman system service'; then
        kill "$pid"
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
        log "service: stopped pid $pid"
    else
        log "service: pid $pid is not running"
    fi
    rm -f "$PID_FILE"
}

# --- 4. base image ------------------------------------------------------------------
image_exists() { podman image exists "$1"; }

base_image() {
    if image_exists "$BASE_IMAGE"; then log "base: $BASE_IMAGE present"; return; fi
    local rootfs="$CACHE_DIR/rootfs-bookworm"
    mkdir -p "$CACHE_DIR"
    if [ ! -f "$rootfs/.tidewatch-complete" ]; then
        rm -rf "$rootfs"
        log "base: debootstrap --variant=minbase bookworm (about 30 s)"
        as_root debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian >"$CACHE_DIR/debootstrap.log" 2>&1 ||
            die "debootstrap failed, see $CACHE_DIR/debootstrap.log"
        as_root rm -rf "$rootfs/var/cache/apt/archives/"*.deb "$rootfs/var/lib/apt/lists/"*
        as_root touch "$rootfs/.tidewatch-complete"
    fi
    log "base: podman import -> $BASE_IMAGE"
    as_root tar -C "$rootfs" --exclude=./.tidewatch-complete -c . |
        podman import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' - "$BASE_IMAGE" >/dev/null
}

# --- 5. project images ----------------------------------------------------------------
# hash of: the image name, the base image id, every file of the build inputs
inputs_hash() {
    local name="$1"; shift
    {
        echo "$name"
        podman image inspect --format '{{.Id}}' "$BASE_IMAGE"
        for f in "$@"; do
            if [ -d "$f" ]; then
                find "$f" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | sort -z | xargs -0 -r sha256sum
            elif [ -f "$f" ]; then sha256sum "$f"; fi
        done
    } | sha256sum | cut -c1-16
}

build_image() {
    # build_image NAME CONTEXT CONTAINERFILE HASH [build args...]
    local name="$1" context="$2" containerfile="$3" hash="$4"; shift 4
    local image="localhost/tidewatch-$name"
    local have
    have="$(podman image inspect --format '{{index .Labels "tidewatch.inputs"}}' "$image:latest" 2>/dev/null || true)"
    if [ "$have" = "$hash" ]; then log "image: $image:latest up to date ($hash)"; return; fi
    log "image: building $image ($hash)"
    local t0=$SECONDS
    podman build --layers --build-arg "BASE_IMAGE=$BASE_IMAGE" "$@" \
        --label "tidewatch.inputs=$hash" -t "$image:$hash" -t "$image:latest" \
        -f "$containerfile" "$context" >"$RUN_DIR/build-$name.log" 2>&1 ||
        die "building $image failed, see $RUN_DIR/build-$name.log"
    log "image: $image built in $((SECONDS - t0)) s"
    # drop the tags of earlier builds (layers still used by the new build stay as cache)
    local tag
    for tag in $(podman images --format '{{.Tag}}' "$image" 2>/dev/null); do
        case "$tag" in latest | "$hash") ;; *) podman rmi "$image:$tag" >/dev/null 2>&1 || true ;; esac
    done
}

# $1: the Kafka version, $2: the cache_dir setting (image_settings)
stage_kafka_libs() {
    local version="$1" src="$2/kafka/$1/libs" dst="$ROOT/containers/kafka/libs"
    if [ ! -f "$src/.complete" ]; then
        if [ -x "$ROOT/.venv/bin/python" ]; then
            log "kafka jars: resolving $version from Maven Central"
            (cd "$ROOT" && .venv/bin/python -m tidewatch.jars kafka >&2)
        fi
        [ -f "$src/.complete" ] || die "no Kafka jars in $src: run scripts/setup.sh (or python -m tidewatch.jars kafka)"
    fi
    if [ -f "$dst/.source" ] && [ "$(cat "$dst/.source")" = "$src" ] &&
        diff -q <(cd "$src" && ls -- *.jar) <(cd "$dst" && ls -- *.jar) >/dev/null 2>&1; then
        return
    fi
    rm -rf "$dst"
    mkdir -p "$dst"
    cp -l "$src"/*.jar "$dst"/ 2>/dev/null || cp "$src"/*.jar "$dst"/
    echo "$src" >"$dst/.source"
}

# $1: the cache_dir setting (image_settings)
stage_spark_jars() {
    local src="$1/spark-jars" dst="$ROOT/containers/app/spark-jars"
    mkdir -p "$dst"
    [ -f "$src/.complete" ] || { log "spark jars: none cached (the container engine will use Ivy)"; return; }
    if [ -f "$dst/.complete" ] && cmp -s "$src/.complete" "$dst/.complete" &&
        diff -q <(cd "$src" && ls -- *.jar) <(cd "$dst" && ls -- *.jar) >/dev/null 2>&1; then
        return
    fi
    rm -f "$dst"/*.jar "$dst/.complete"
    cp -l "$src"/*.jar "$dst"/ 2>/dev/null || cp "$src"/*.jar "$dst"/
    cp "$src/.complete" "$dst/.complete"
}

build_images() {
    mkdir -p "$RUN_DIR"
    local c="$ROOT/containers" kv jars
    build_image postgres "$c/postgres" "$c/postgres/Containerfile" \
        "$(inputs_hash postgres "$c/postgres")"

    read -r kv jars <<<"$(image_settings)"
    stage_kafka_libs "$kv" "$jars"
    # the jar list (names and sizes), not their bytes: hashing 40 MB every run is wasted time
    build_image kafka "$c/kafka" "$c/kafka/Containerfile" \
        "$(inputs_hash "kafka-$kv-$(cd "$c/kafka/libs" && ls -l -- *.jar | awk '{print $5, $9}' | sha256sum | cut -c1-16)" \
            "$c/kafka/Containerfile" "$c/kafka/entrypoint.sh" "$c/kafka/log4j2.properties")" \
        --build-arg "KAFKA_VERSION=$kv"

    stage_spark_jars "$jars"
    local pip_cache=()
    [ -d "$HOME/.cache/pip" ] && pip_cache=(-v "$HOME/.cache/pip:/root/.cache/pip")
    # the host's CA bundle, for pip behind a TLS-intercepting proxy (a public cert, not a secret)
    local host_ca=/etc/ssl/certs/ca-certificates.crt
    [ -f "$host_ca" ] && pip_cache+=(-v "$host_ca:/run/tidewatch-host-ca.crt:ro" --build-arg PIP_CERT=/run/tidewatch-host-ca.crt)
    build_image app "$ROOT" "$c/app/Containerfile" \
        "$(inputs_hash app "$c/app/Containerfile" "$c/app/spark-jars/.complete" "$ROOT/alembic.ini" "$ROOT/pyproject.toml" "$ROOT/constraints.txt" "$ROOT/.dockerignore" \
            "$ROOT/tidewatch" "$ROOT/engine" "$ROOT/subscriptions" "$ROOT/ingest" "$ROOT/dashboard" "$ROOT/migrations")" \
        "${pip_cache[@]}"
}

status() {
    for p in podman runc podman-compose debootstrap; do
        printf '%-16s %s\n' "$p" "$(command -v "$p" || echo missing)"
    done
    if socket_answers; then echo "service          unix://$SOCKET answers"; else echo "service          not answering on $SOCKET"; fi
    command -v podman >/dev/null && podman images --filter 'reference=localhost/tidewatch-*' \
        --format '{{.Repository}}:{{.Tag}}  {{.Size}}  {{.Created}}' || true
}

main() {
    local cmd="${1:-setup}" t0=$SECONDS
    case "$cmd" in
        setup)
            if [ "${2:-}" != "--keep-service" ]; then
                # nothing left running, also when a step below fails: the test fixtures start (and
                # stop) the service themselves
                trap 'if [ "$STARTED_SERVICE" = 1 ]; then stop_service; fi' EXIT
            fi
            install_packages
            write_conf
            start_service
            base_image
            build_images
            if [ "$STARTED_SERVICE" = 1 ] && [ "${2:-}" != "--keep-service" ]; then
                stop_service
                STARTED_SERVICE=0
                log "ready in $((SECONDS - t0)) s (images built; the API service is started on demand)"
            else
                log "ready in $((SECONDS - t0)) s: DOCKER_HOST=unix://$SOCKET"
            fi
            ;;
        start) start_service ;;
        stop) stop_service ;;
        status) status ;;
        images) base_image; build_images ;;
        *) die "unknown command $cmd (setup|start|stop|status|images)" ;;
    esac
}

main "$@"
