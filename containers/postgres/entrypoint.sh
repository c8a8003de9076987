#!/bin/bash
# Initialise $PGDATA on first start from POSTGRES_USER / POSTGRES_PASSWORD /
# POSTGRES_DB (the official image's contract), then run postgres in the
# foreground as the postgres OS user (initdb refuses root).
set -euo pipefail

POSTGRES_USER="${POSTGRES_USER:-postgres}"
POSTGRES_PASSWORD="${POSTGRES_PASSWORD:-}"
POSTGRES_DB="${POSTGRES_DB:-$POSTGRES_USER}"
PGDATA="${PGDATA:-/var/lib/postgresql/data}"
export PGDATA

as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"; }

mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" /var/run/postgresql
chmod 0700 "$PGDATA"

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile="$(mktemp)"
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    chown postgres "$pwfile"
    if [ -n "$POSTGRES_PASSWORD" ]; then host_auth=scram-sha-256; pwopt=(--pwfile="$pwfile"); else host_auth=trust; pwopt=(); fi
    as_postgres initdb --username="$POSTGRES_USER" "${pwopt[@]}" --encoding=UTF8 --locale=C.UTF-8 \
        --auth-local=trust --auth-host="$host_auth" >/dev/null
    rm -f "$pwfile"
    {
        echo "host all all 0.0.0.0/0 $host_auth"
        echo "host all all ::/0 $host_auth"
    } >>"$PGDATA/pg_hba.conf"
    if [ "$POSTGRES_DB" != "postgres" ]; then
        as_postgres pg_ctl -D "$PGDATA" -w -o "-c listen_addresses='' -k /var/run/postgresql" start >/dev/null
        as_postgres createdb -h /var/run/postgresql -U "$POSTGRES_USER" "$POSTGRES_DB"
        as_postgres pg_ctl -D "$PGDATA" -w -m fast stop >/dev/null
    fi
    echo "tidewatch-postgres: initialised $PGDATA (user $POSTGRES_USER, database $POSTGRES_DB)"
fi

exec setpriv --reuid=postgres --regid=postgres --init-groups -- \
    postgres -D "$PGDATA" -c listen_addresses='*' -k /var/run/postgresql "$@"
