#!/usr/bin/env bash
# Set up everything Tidewatch needs on a fresh Debian machine (or refresh it), idempotently:
#   1. Debian packages that are missing: python3-venv, PostgreSQL (server binaries only, no
#      default cluster), a Java runtime and Maven;
#   2. the virtualenv .venv with `pip install -e '.[dev]'` (redone only when pyproject.toml
#      changes: stamp .venv/.tidewatch-installed holds its hash);
#   3. Apache Kafka's jars, its command-line tools and the Spark connector jars from Maven Central
#      into .cache/ (python -m tidewatch.jars; no-op when cached);
#   4. with --with-containers: scripts/containers_setup.sh (Podman + images for the
#      integration tests), when that script is present.
# Quiet and fast when everything is in place.  Usage: scripts/setup.sh [--with-containers]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
WITH_CONTAINERS=0
for arg in "$@"; do
    case "$arg" in
        --with-containers) WITH_CONTAINERS=1 ;;
        -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
        *) echo "setup.sh: unknown argument $arg" >&2; exit 2 ;;
    esac
done

log() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }
as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        die "needs root for: $* (run as root or install sudo)"
    fi
}

# --- 1. Debian packages ---------------------------------------------------------------------
have_pg() { ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; }
have_venv() { python3 -c 'import ensurepip, venv' >/dev/null 2>&1; }

pkgs=()
command -v python3 >/dev/null 2>&1 || pkgs+=(python3)
have_venv || pkgs+=(python3-venv)
have_pg || pkgs+=(postgresql)
command -v java >/dev/null 2>&1 || pkgs+=(default-jre-headless)
command -v mvn >/dev/null 2>&1 || pkgs+=(maven)
command -v runuser >/dev/null 2>&1 || pkgs+=(util-linux)
if [ "$WITH_CONTAINERS" = 1 ]; then
    # test-only tools: Debian's chromium for the browser tests, tcpdump for live pcap capture
    [ -x /usr/bin/chromium ] || pkgs+=(chromium)
    command -v tcpdump >/dev/null 2>&1 || pkgs+=(tcpdump)
fi
if [ "${#pkgs[@]}" -gt 0 ]; then
    command -v apt-get >/dev/null 2>&1 || die "missing ${pkgs[*]} and no apt-get: install them by hand"
    log "installing Debian packages: ${pkgs[*]}"
    if [[ " ${pkgs[*]} " == *" postgresql "* ]]; then
        # binaries only: Tidewatch runs its own cluster (own data dir and port), not Debian's main one
        as_root mkdir -p /etc/postgresql-common
        if [ ! -f /etc/postgresql-common/createcluster.conf ]; then
            echo "create_main_cluster = false" | as_root tee /etc/postgresql-common/createcluster.conf >/dev/null
        fi
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
fi

# --- 2. virtualenv --------------------------------------------------------------------------
if [ ! -x .venv/bin/python ]; then
    log "creating .venv"
    python3 -m venv .venv
fi
stamp=.venv/.tidewatch-installed
want="$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || [ ! -x .venv/bin/tidewatch ]; then
    log "installing Python dependencies (pip install -e '.[dev]')"
    if ! .venv/bin/python -m pip install --disable-pip-version-check -c constraints.txt -e '.[dev]' >.venv/pip-install.log 2>&1; then
        tail -n 30 .venv/pip-install.log >&2
        die "pip install failed (full log: .venv/pip-install.log)"
    fi
    echo "$want" > "$stamp"
fi

# --- 3. Kafka and Spark connector jars ------------------------------------------------------
# Kafka is required; Kafka's command-line tools (tidewatch kafka ...) and the Spark connector jars
# only warn (the tools resolve on first use; Spark may still resolve its jars with Ivy)
.venv/bin/python -m tidewatch.jars kafka 'kafka-tools?' 'spark?' >/dev/null \
    || die "could not fetch the Kafka jars (see above)"

# --- 4. containers for the integration tests ------------------------------------------------
if [ "$WITH_CONTAINERS" = 1 ] && [ -x scripts/containers_setup.sh ]; then
    scripts/containers_setup.sh setup
fi
log "ready"
