#!/usr/bin/env bash
# Old against new, side by side in one run: a benchmark of this repository run alternately from
# a copy of commit OLD's tree and from the working tree (each bench puts its own tree first on
# sys.path), RUNS times each.  The copy is made in a temporary folder and removed afterwards; a
# bench that OLD lacks is copied into it from the working tree.  Numba's on-disk cache is per
# tree: the copy compiles its kernels on first use, so a bench whose start matters (--live) needs
# RUNS >= 2 and its first run left out.  AB_SAME_BENCH=1 runs the working tree's bench file on
# both trees.  PYTHONPATH is each side's tree, so that Spark's Python workers (started by the JVM,
# which passes the driver's PYTHONPATH on) import that tree's modules too: without it they took
# the project's editable install, the working tree, on both sides (before 2026-11-29, 21:30 UTC).
#
#   bench/ab_trees.sh OLD RUNS BENCH [ARGS...]
#   bench/ab_trees.sh 52c964f 2 bench/engine_bench.py --core-only --events 1500000 \
#       --max-offsets 250000 --rules 10000 --keys 5000
set -euo pipefail
if [ $# -lt 3 ]; then
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
old=$1 runs=$2 bench=$3
shift 3
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# both sides talk to this checkout's services and caches (`tidewatch up --services-only` here):
# the settings' defaults are under each tree, and OLD's copy has none (its PostgreSQL socket
# "No such file or directory", 2026-12-01)
export TIDEWATCH_RUN_DIR=${TIDEWATCH_RUN_DIR:-$root/.run}
export TIDEWATCH_CACHE_DIR=${TIDEWATCH_CACHE_DIR:-$root/.cache}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git -C "$root" archive "$old" | tar -x -C "$tmp"
# a bench new in the working tree runs the same file on both trees (from inside each); so does
# any bench with AB_SAME_BENCH=1 (a bench that gained an option the old tree's copy lacks)
if [ ! -e "$tmp/$bench" ] || [ -n "${AB_SAME_BENCH:-}" ]; then cp "$root/$bench" "$tmp/$bench"; fi
for i in $(seq 1 "$runs"); do
  for side in old new; do
    tree=$root
    [ "$side" = old ] && tree=$tmp
    echo "== $side ($([ "$side" = old ] && echo "$old" || echo "working tree")), run $i, $(date -u +%T) UTC, load $(cut -d' ' -f1 /proc/loadavg)"
    (cd /tmp && PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" "$root/.venv/bin/python" "$tree/$bench" "$@")
  done
done
