# syntax=docker/dockerfile:1
# PostgreSQL 15 with pg_lease installed, preloaded, and created in POSTGRES_DB.
#
#   docker build -t pg_lease .
#   docker run -d --name game-db -e POSTGRES_PASSWORD=secret -e POSTGRES_DB=game -p 5432:5432 pg_lease
#   psql postgres://postgres:secret@localhost:5432/game -c 'SELECT * FROM lease.audit_status()'

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# The same target `make test` runs: scripts/setup.sh installs the Debian
# packages and cargo-pgrx pinned to the lockfile's pgrx (0.18.0), then
# `cargo pgrx package` lays the files out under target/release/pg_lease-pg15.
RUN make package

FROM postgres:15-bookworm
COPY --from=build /src/target/release/pg_lease-pg15/usr/share/postgresql/15/extension/ /usr/share/postgresql/15/extension/
COPY --from=build /src/target/release/pg_lease-pg15/usr/lib/postgresql/15/lib/ /usr/lib/postgresql/15/lib/
# Every cluster initialised from this image preloads pg_lease (audit queue, worker, stats).
RUN echo "shared_preload_libraries = 'pg_lease'" >> /usr/share/postgresql/postgresql.conf.sample
COPY docker/initdb/10-pg_lease.sh /docker-entrypoint-initdb.d/
