#!/bin/sh
# Initialises an empty PGDATA once, then runs postgres with the arguments given.
set -eu
: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}"
USER_NAME="${POSTGRES_USER:-postgres}"
DB_NAME="${POSTGRES_DB:-$USER_NAME}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  mkdir -p "$PGDATA" && chmod 700 "$PGDATA"
  PWFILE="$(mktemp)"
  printf '%s\n' "$POSTGRES_PASSWORD" > "$PWFILE"
  initdb --pgdata="$PGDATA" --username="$USER_NAME" --pwfile="$PWFILE" \
    --auth-local=trust --auth-host=scram-sha-256 --encoding=UTF8 >/dev/null
  rm -f "$PWFILE"
  # Connections from other pods: password only, never trust.
  echo 'host all all all scram-sha-256' >> "$PGDATA/pg_hba.conf"
  echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
  if [ "$DB_NAME" != postgres ]; then
    # A server on the Unix socket only, for as long as the database takes to create.
    pg_ctl --pgdata="$PGDATA" --options="-c listen_addresses=''" --wait --silent start
    psql --username="$USER_NAME" --dbname=postgres --quiet --no-psqlrc --set ON_ERROR_STOP=1 \
      --command="CREATE DATABASE \"$DB_NAME\" OWNER \"$USER_NAME\""
    pg_ctl --pgdata="$PGDATA" --mode=fast --wait --silent stop
  fi
fi
exec postgres -D "$PGDATA" "$@"
