#!/usr/bin/env bash
# The Dockerfile cannot be built on machines without a Docker engine; this
# checks what it relies on instead: `make package` (its build stage) produced
# every path its runtime stage copies, and its init script is in place.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
while read -r src; do
    path=${src#/src/}
    if [ ! -e "$path" ] || [ -z "$(ls -A "$path" 2>/dev/null)" ]; then
        echo "check-dockerfile: $path (COPY --from=build $src) is missing or empty after make package" >&2
        status=1
    fi
done < <(sed -n 's/^COPY --from=build \([^ ]*\) .*/\1/p' Dockerfile)
grep -q '^RUN make package$' Dockerfile || { echo "check-dockerfile: the build stage must RUN make package" >&2; status=1; }
for f in $(sed -n 's/^COPY \(docker\/[^ ]*\) .*/\1/p' Dockerfile); do
    [ -x "$f" ] || { echo "check-dockerfile: $f is missing or not executable" >&2; status=1; }
done
for f in pg_lease.control "pg_lease--$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1).sql"; do
    [ -f "target/release/pg_lease-pg15/usr/share/postgresql/15/extension/$f" ] \
        || { echo "check-dockerfile: package lacks $f" >&2; status=1; }
done
[ -f target/release/pg_lease-pg15/usr/lib/postgresql/15/lib/pg_lease.so ] \
    || { echo "check-dockerfile: package lacks pg_lease.so" >&2; status=1; }
[ $status -eq 0 ] && echo "check-dockerfile: the package has everything the Dockerfile copies"
exit $status
