#!/usr/bin/env bash
# Citus (the scale-out engine) for the Citus tests (tests/sessions/tests/citus.rs)
# and the bench's Citus row, built from its vendored source (run as root).
#   scripts/citus.sh install   build and install Citus 13.2.2 into the PostgreSQL of
#                              $PG_CONFIG (idempotent: quick when it is there)
#   scripts/citus.sh src       print the vendored source folder
#   scripts/citus.sh supports  exit 0 if Citus 13.2.2 supports $PG_CONFIG's major, else
#                              print why not and exit 3
# The source folder (citus-13.2.2.tar.xz, its patch and build.sh) is
# $PG_LEASE_CITUS_SRC, else ../shared/vendor/citus beside this repository, else
# /work/shared/vendor/citus. Citus is in no package registry these machines reach.
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "citus.sh: $*" >&2; exit 1; }

src() {
    local d
    for d in "${PG_LEASE_CITUS_SRC:-}" ../shared/vendor/citus /work/shared/vendor/citus; do
        [ -n "$d" ] || continue
        if [ -f "$d/build.sh" ] && [ -f "$d/citus-13.2.2.tar.xz" ]; then
            (cd "$d" && pwd)
            return
        fi
        [ "$d" != "${PG_LEASE_CITUS_SRC:-}" ] \
            || die "PG_LEASE_CITUS_SRC=$d holds no build.sh and citus-13.2.2.tar.xz"
    done
    die "no Citus source: set PG_LEASE_CITUS_SRC to the folder with citus-13.2.2.tar.xz and build.sh (looked in ../shared/vendor/citus and /work/shared/vendor/citus)"
}

pg_config=${PG_CONFIG:-$(scripts/pg.sh pg_config)}
[ -x "$pg_config" ] || command -v "$pg_config" >/dev/null || die "no pg_config '$pg_config' (set PG_CONFIG)"

supports() {
    local major
    major=$("$pg_config" --version | sed -n 's/^PostgreSQL \([0-9]*\).*/\1/p')
    case "$major" in
    15|16|17) ;;
    *) echo "Citus 13.2.2 supports PostgreSQL 15-17 only; $pg_config is PostgreSQL $major"; return 3 ;;
    esac
}

case "${1:-}" in
src) src ;;
supports) supports ;;
install)
    reason=$(supports) || die "$reason"
    [ "$(id -u)" = 0 ] || die "install: run as root (build.sh installs build dependencies and writes into $("$pg_config" --pkglibdir))"
    dir=$(src)
    PG_CONFIG=$pg_config bash "$dir/build.sh"
    libdir=$("$pg_config" --pkglibdir)
    grep -aq "Citus 13\.2\.2" "$libdir/citus.so" || die "build.sh ended but $libdir/citus.so is not Citus 13.2.2"
    ;;
*) echo "usage: [PG_CONFIG=...] $0 install|src|supports" >&2; exit 2 ;;
esac
