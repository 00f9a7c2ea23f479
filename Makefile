# pg_lease — every target installs what it needs (scripts/setup.sh).
# PG=15 (default) or PG=18 picks the PostgreSQL major: make test PG=18,
# make install PG=18, make package PG=18 (18 is built from source on first use).
.PHONY: setup build install package test demo bench chaos fuzz fmt clean

PG ?= 15
export PG
# cargo pgrx arguments for the chosen major.
PGRX_ARGS = --pg-config "$$(scripts/pg.sh pg_config)" $$(scripts/pg.sh features)

setup:
	scripts/setup.sh

build: setup
	cargo build $$(scripts/pg.sh features)

install: setup
	cargo pgrx install $(PGRX_ARGS)

# Release files laid out as Debian's PostgreSQL $(PG) installs them, under
# target/release/pg_lease-pg$(PG)/ (what the Dockerfile copies into the postgres image).
package: setup
	scripts/package.sh

test:
	scripts/test.sh

demo:
	scripts/demo.sh

bench:
	scripts/setup.sh bench
	python3 bench/run.py

# Fault-injection run: make chaos [CHAOS_SECONDS=600] [CHAOS_SEED=n]
CHAOS_SECONDS ?= 600
chaos: install
	PG_CONFIG="$$(scripts/pg.sh pg_config)" cargo run --release --manifest-path tests/sessions/Cargo.toml --bin chaos -- \
		run --seconds $(CHAOS_SECONDS) $(if $(CHAOS_SEED),--seed $(CHAOS_SEED))

# Long run of the model-based test tests/sessions/tests/model.rs (make test runs
# 64 cases per family): make fuzz [PG_LEASE_MODEL_CASES=2000] [PG_LEASE_MODEL_SEED=n]
fuzz: install
	PG_CONFIG="$$(scripts/pg.sh pg_config)" scripts/fuzz.sh

fmt:
	cargo fmt
	cargo fmt --manifest-path tests/sessions/Cargo.toml

clean:
	cargo clean
	cargo clean --manifest-path tests/sessions/Cargo.toml
