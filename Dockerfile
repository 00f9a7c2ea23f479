# syntax=docker/dockerfile:1
# PostgreSQL with pg_lease installed, preloaded, and created in POSTGRES_DB.
# PG_MAJOR picks the major: 15 (default) or 18, the two built and tested here.
#
#   docker build -t pg_lease .                               # PostgreSQL 15
#   docker build --build-arg PG_MAJOR=18 -t pg_lease:18 .    # PostgreSQL 18
#   docker run -d --name game-db -e POSTGRES_PASSWORD=secret -e POSTGRES_DB=game -p 5432:5432 pg_lease
#   psql postgres://postgres:secret@localhost:5432/game -c 'SELECT * FROM lease.audit_status()'
ARG PG_MAJOR=15

FROM rust:1.95-bookworm AS build
ARG PG_MAJOR
WORKDIR /src
COPY . .
# The same target `make test` runs: scripts/setup.sh installs the Debian
# packages and cargo-pgrx pinned to the lockfile's pgrx (0.18.0) (for 18 it
# also builds PostgreSQL 18 from Debian's source package to build against),
# then scripts/package.sh lays the files out as Debian's PostgreSQL PG_MAJOR
# does, under target/release/pg_lease-pgPG_MAJOR.
RUN make package PG=${PG_MAJOR}

FROM postgres:${PG_MAJOR}-bookworm
ARG PG_MAJOR
COPY --from=build /src/target/release/pg_lease-pg${PG_MAJOR}/usr/share/postgresql/${PG_MAJOR}/extension/ /usr/share/postgresql/${PG_MAJOR}/extension/
COPY --from=build /src/target/release/pg_lease-pg${PG_MAJOR}/usr/lib/postgresql/${PG_MAJOR}/lib/ /usr/lib/postgresql/${PG_MAJOR}/lib/
# Every cluster initialised from this image preloads pg_lease (audit queue, worker, stats).
RUN echo "shared_preload_libraries = 'pg_lease'" >> /usr/share/postgresql/postgresql.conf.sample
COPY docker/initdb/10-pg_lease.sh /docker-entrypoint-initdb.d/
