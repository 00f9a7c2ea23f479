#!/usr/bin/env bash
# `make package [PG=15|18]`: the release build of pg_lease laid out as Debian's
# (and the official postgres image's) PostgreSQL <major> installs extensions,
#   target/release/pg_lease-pg<major>/usr/lib/postgresql/<major>/lib/pg_lease.so
#   target/release/pg_lease-pg<major>/usr/share/postgresql/<major>/extension/pg_lease*
# whatever directory the PostgreSQL it was built against lives in (PostgreSQL
# 18 is built under /opt/pg_lease/pg18 here). What the Dockerfile copies.
set -euo pipefail
cd "$(dirname "$0")/.."
major=$(scripts/pg.sh major)
pg_config=$(scripts/pg.sh pg_config)
[ -x "$pg_config" ] || { echo "package: no $pg_config: PostgreSQL $major is not installed (make setup PG=$major installs it)" >&2; exit 1; }
read -ra features <<< "$(scripts/pg.sh features)"
out=target/release/pg_lease-pg$major
rm -rf "$out"
cargo pgrx package --pg-config "$pg_config" "${features[@]}"
# cargo pgrx lays the files out under the build's own pg_config paths.
built="${CARGO_TARGET_DIR:-target}/release/pg_lease-pg$major"
lib=$("$pg_config" --pkglibdir); share=$("$pg_config" --sharedir)/extension
staged=$(mktemp -d)
trap 'rm -rf "$staged"' EXIT
mkdir -p "$staged/usr/lib/postgresql/$major/lib" "$staged/usr/share/postgresql/$major/extension"
cp -a "$built$lib"/pg_lease* "$staged/usr/lib/postgresql/$major/lib/"
cp -a "$built$share"/pg_lease* "$staged/usr/share/postgresql/$major/extension/"
rm -rf "$built"
mkdir -p "$out"
cp -a "$staged/usr" "$out/"
echo "package: $out (PostgreSQL $major layout)"
