#!/usr/bin/env bash
# Fails when the installed SQL changes without a new version and an upgrade
# script: the schema `cargo pgrx schema` generates for the version in
# Cargo.toml must equal sql/released/pg_lease--<version>.sql, and every
# released version must have an upgrade script to the next one.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
released=sql/released/pg_lease--$version.sql
generated=$(mktemp)
trap 'rm -f "$generated"' EXIT
cargo pgrx schema pg15 -o "$generated" >/dev/null 2>&1 || cargo pgrx schema pg15 -o "$generated"
# pgrx stamps source line numbers into comments; they are not schema.
normalize() { grep -Ev '^-- [A-Za-z0-9_/.-]+\.rs:[0-9]+$' "$1"; }

if [ ! -f "$released" ]; then
    echo "check-schema: no $released. A new version needs its schema frozen there" >&2
    echo "  (cargo pgrx schema pg15 -o $released) and sql/pg_lease--<previous>--$version.sql." >&2
    exit 1
fi
if ! diff -u <(normalize "$released") <(normalize "$generated") > /tmp/pg_lease-schema.diff; then
    cat /tmp/pg_lease-schema.diff >&2
    echo "check-schema: the generated SQL differs from released $version (diff above)." >&2
    echo "  Bump the version in Cargo.toml, freeze the new schema in sql/released/, and write" >&2
    echo "  sql/pg_lease--$version--<new>.sql that turns $version into it." >&2
    exit 1
fi
previous=""
for v in $(ls sql/released | sed -E 's/^pg_lease--(.*)\.sql$/\1/' | sort -V); do
    if [ -n "$previous" ] && [ ! -f "sql/pg_lease--$previous--$v.sql" ]; then
        echo "check-schema: missing upgrade script sql/pg_lease--$previous--$v.sql" >&2
        exit 1
    fi
    previous=$v
done
echo "check-schema: $version matches its released schema; upgrade path complete"
