#!/usr/bin/env bash
# The Dockerfile cannot be built on machines without a Docker engine; this
# checks what it relies on instead, for the major PG (15 default, or 18, as the
# build argument PG_MAJOR): `make package PG=<major>` (its build stage)
# produced every path its runtime stage copies, and its init script is in place.
set -euo pipefail
cd "$(dirname "$0")/.."
major=$(scripts/pg.sh major)
status=0
grep -q '^ARG PG_MAJOR=15$' Dockerfile || { echo "check-dockerfile: the Dockerfile must take ARG PG_MAJOR (default 15)" >&2; status=1; }
# The ${PG_MAJOR} in these patterns is the Dockerfile's own text, not a shell expansion.
# shellcheck disable=SC2016
grep -q '^FROM postgres:${PG_MAJOR}-bookworm$' Dockerfile \
    || { echo "check-dockerfile: the runtime stage must be FROM postgres:\${PG_MAJOR}-bookworm" >&2; status=1; }
while read -r src; do
    path=${src#/src/}
    path=${path//\$\{PG_MAJOR\}/$major}
    if [ ! -e "$path" ] || [ -z "$(ls -A "$path" 2>/dev/null)" ]; then
        echo "check-dockerfile: $path (COPY --from=build $src, PG_MAJOR=$major) is missing or empty after make package" >&2
        status=1
    fi
done < <(sed -n 's/^COPY --from=build \([^ ]*\) .*/\1/p' Dockerfile)
# shellcheck disable=SC2016  # the Dockerfile's literal ${PG_MAJOR}, as above
grep -q '^RUN make package PG=${PG_MAJOR}$' Dockerfile \
    || { echo "check-dockerfile: the build stage must RUN make package PG=\${PG_MAJOR}" >&2; status=1; }
while read -r f; do
    [ -x "$f" ] || { echo "check-dockerfile: $f is missing or not executable" >&2; status=1; }
done < <(sed -n 's/^COPY \(docker\/[^ ]*\) .*/\1/p' Dockerfile)
package=target/release/pg_lease-pg$major
for f in pg_lease.control "pg_lease--$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1).sql"; do
    [ -f "$package/usr/share/postgresql/$major/extension/$f" ] \
        || { echo "check-dockerfile: package lacks $f" >&2; status=1; }
done
[ -f "$package/usr/lib/postgresql/$major/lib/pg_lease.so" ] \
    || { echo "check-dockerfile: package lacks pg_lease.so" >&2; status=1; }
[ $status -eq 0 ] && echo "check-dockerfile: the PostgreSQL $major package has everything the Dockerfile copies"
exit $status
