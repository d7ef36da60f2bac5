#!/usr/bin/env bash
# Runs a command beside a private, throwaway PostgreSQL server, then stops the server.
#
#   Benchmarks/with-postgres.sh swift run -c release --package-path Benchmarks conveyor-benchmarks postgres
#
# The server comes from the installed binaries (`pg_config --bindir`, else the newest
# /usr/lib/postgresql/<version>/bin), runs as `postgres` when this script runs as root (the server
# refuses root), keeps its data and socket in a new temporary folder, listens on 127.0.0.1 on a
# free port with `trust` authentication, and is stopped and deleted when the command ends, however
# it ends. The command finds the server in CONVEYOR_POSTGRES_URL. Durability is off (fsync,
# synchronous_commit and full_page_writes, as on the tests' server), so the figures show the
# store's own cost, not the disk's flush time (with fsync on a shared VM disk every commit waited
# about 1.6 ms, whoever sent it); POSTGRES_OPTIONS adds or overrides `-c name=value` flags.
set -euo pipefail

bindir=$(pg_config --bindir 2>/dev/null || true)
if [ ! -x "$bindir/initdb" ] || [ ! -x "$bindir/pg_ctl" ]; then
  bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
fi
if [ ! -x "$bindir/initdb" ]; then
  echo "with-postgres.sh: no initdb; install the postgresql package" >&2
  exit 1
fi

folder=$(mktemp -d "${TMPDIR:-/tmp}/conveyor-bench-pg-XXXXXX")
as_owner() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
if [ "$(id -u)" -eq 0 ]; then chown postgres: "$folder"; fi
chmod 755 "$folder"

stop() {
  as_owner "$bindir/pg_ctl" -D "$folder/data" stop -m fast -w >/dev/null 2>&1 || true
  rm -rf "$folder"
}
trap stop EXIT
trap 'exit 130' INT TERM

as_owner "$bindir/initdb" -D "$folder/data" -U postgres -A trust -E UTF8 --locale=C --no-sync >/dev/null

# A random free port: a port in use makes the postmaster exit at once, and the next one is tried.
started=""
for _ in $(seq 1 20); do
  port=$((20000 + RANDOM % 40000))
  if as_owner "$bindir/pg_ctl" -D "$folder/data" -l "$folder/server.log" -w -t 60 start \
    -o "-p $port -k $folder -c listen_addresses=127.0.0.1 -c max_connections=100 -c fsync=off -c synchronous_commit=off -c full_page_writes=off ${POSTGRES_OPTIONS:-}" \
    >/dev/null; then
    started=yes
    break
  fi
done
if [ -z "$started" ]; then
  echo "with-postgres.sh: the server did not start; see its log:" >&2
  cat "$folder/server.log" >&2 || true
  exit 1
fi

export CONVEYOR_POSTGRES_URL="postgresql://postgres@127.0.0.1:$port/postgres"
echo "with-postgres.sh: PostgreSQL $("$bindir/postgres" --version | awk '{print $3}') on port $port" \
  "(data in $folder)" >&2
"$@"
