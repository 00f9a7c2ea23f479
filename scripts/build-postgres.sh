#!/usr/bin/env bash
# Builds a PostgreSQL major that Debian 12 does not ship as binaries from
# Debian's source package (suite sid), into a fixed directory outside any work
# tree (run as root):
#   scripts/build-postgres.sh MAJOR      e.g. 18
# The install directory is $PG_LEASE_PG<MAJOR>_DIR (default /opt/pg_lease/pg<MAJOR>).
# Idempotent: returns at once when that directory holds a finished build of
# MAJOR. Prints the path of its pg_config on stdout; progress goes to stderr.
set -euo pipefail
major=${1:-}
if ! [[ "$major" =~ ^[0-9]+$ ]]; then
    echo "usage: $0 MAJOR   (e.g. 18)" >&2
    exit 2
fi
dir_var=PG_LEASE_PG${major}_DIR
prefix=${!dir_var:-/opt/pg_lease/pg$major}
stamp=$prefix/.pg_lease-build
say() { echo "build-postgres: $*" >&2; }
# Under `make test PG=18` this runs inside another make: PostgreSQL's makefiles
# build their generated headers first only when they are the top-level make.
unset MAKELEVEL MAKEFLAGS MFLAGS
trap 'echo "build-postgres: failed (line $LINENO)" >&2' ERR

if [ -f "$stamp" ] && "$prefix/bin/pg_config" --version 2>/dev/null | grep -q "^PostgreSQL $major\."; then
    echo "$prefix/bin/pg_config"
    exit 0
fi

# What the build needs: Debian's package tools, and root for them and for $prefix.
if ! command -v apt-get >/dev/null || ! command -v dpkg >/dev/null; then
    echo "build-postgres: needs Debian's apt-get and dpkg (it builds from Debian's source package, on Debian 12)" >&2
    exit 1
fi
[ "$(id -u)" = 0 ] \
    || { echo "build-postgres: building PostgreSQL $major into $prefix needs root (apt-get, /etc/apt/sources.list.d): run it as root" >&2; exit 1; }

# The build's own prerequisites (a fresh Debian 12 machine lacks them).
packages=(bison flex pkg-config libicu-dev libreadline-dev zlib1g-dev bzip2 make gcc)
missing=()
for pkg in "${packages[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
apt_updated=
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    apt-get update -qq
    apt_updated=1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Source packages of sid, from the registry and keyring the machine already
# uses for bookworm (read from its own apt sources, not written here).
src_list=/etc/apt/sources.list.d/pg_lease-sid-src.sources
if [ ! -f "$src_list" ]; then
    uri=""; keyring=""
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then
        read -r uri keyring < <(awk '
            function found() { return deb && u != "" && s ~ /bookworm( |$)/ }
            /^[[:space:]]*$/ { if (found()) exit; deb = 0; u = s = k = ""; next }
            /^Types:/ && / deb( |$)/ { deb = 1 }
            /^URIs:/ { u = $2 }
            /^Suites:/ { s = $0 }
            /^Signed-By:/ { k = $2 }
            END { if (found()) print u, k }' /etc/apt/sources.list.d/debian.sources) || true
    fi
    if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
        # deb [options] URI SUITE COMPONENTS...
        uri=$(awk '$1 == "deb" { i = 2; if ($2 ~ /^\[/) { while (i < NF && $i !~ /\]$/) i++; i++ }
                                 if ($(i + 1) == "bookworm") { print $i; exit } }' /etc/apt/sources.list)
    fi
    if [ -z "$uri" ]; then
        echo "build-postgres: found no Debian bookworm entry in the apt sources to take the registry from" >&2
        exit 1
    fi
    say "adding $src_list (deb-src, sid, main)"
    {
        echo "Types: deb-src"
        echo "URIs: $uri"
        echo "Suites: sid"
        echo "Components: main"
        echo "Signed-By: ${keyring:-/usr/share/keyrings/debian-archive-keyring.gpg}"
    } > "$src_list"
    apt_updated=
fi
if [ -z "$(apt-cache showsrc "postgresql-$major" 2>/dev/null)" ] && [ -z "$apt_updated" ]; then
    apt-get update -qq
fi

work=$(mktemp -d "/var/tmp/pg_lease-build-pg$major.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
say "fetching the postgresql-$major source package"
# apt-get source downloads as the unprivileged _apt user where it can.
chmod 777 "$work"
apt-get source --download-only -qq "postgresql-$major" >/dev/null
tarball=""
for f in postgresql-"$major"_*.orig.tar.{bz2,xz,gz}; do [ -f "$f" ] && tarball=$f && break; done
[ -n "$tarball" ] || { echo "build-postgres: apt-get source fetched no postgresql-${major}_*.orig.tar.*" >&2; exit 1; }
tar xf "$tarball"
src=$(find . -maxdepth 1 -type d -name "postgresql-$major.*" -printf '%f\n')
cd "$src"
say "building $src into $prefix (a few minutes on 2 cores)"
rm -rf "$prefix"
./configure --prefix="$prefix" --with-icu --without-llvm >configure.log 2>&1 \
    || { tail -40 configure.log >&2; exit 1; }
jobs=$(nproc)
# The server and client programs (pg_upgrade, pg_basebackup, pg_dump... are
# in src/bin), then the contrib modules the tests use.
make -s -j"$jobs" >make.log 2>&1 || { tail -40 make.log >&2; exit 1; }
make -s install >>make.log 2>&1 || { tail -40 make.log >&2; exit 1; }
for module in file_fdw dblink; do
    make -s -C "contrib/$module" -j"$jobs" install >>make.log 2>&1 || { tail -40 make.log >&2; exit 1; }
done
"$prefix/bin/pg_config" --version > "$stamp"
say "installed $(cat "$stamp") in $prefix"
echo "$prefix/bin/pg_config"
