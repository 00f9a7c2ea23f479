# pg_lease — every target installs what it needs (scripts/setup.sh).
.PHONY: setup build install package test demo bench chaos fuzz fmt clean

setup:
	scripts/setup.sh

build: setup
	cargo build

install: setup
	cargo pgrx install --pg-config "$$(command -v pg_config)"

# Release files laid out as installed, under target/release/pg_lease-pg15/
# (what the Dockerfile copies into the postgres image).
package: setup
	cargo pgrx package --pg-config "$$(command -v pg_config)"

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
	cargo run --release --manifest-path tests/sessions/Cargo.toml --bin chaos -- \
		run --seconds $(CHAOS_SECONDS) $(if $(CHAOS_SEED),--seed $(CHAOS_SEED))

# Long run of the model-based test tests/sessions/tests/model.rs (make test runs
# 64 cases per family): make fuzz [PG_LEASE_MODEL_CASES=2000] [PG_LEASE_MODEL_SEED=n]
fuzz: install
	scripts/fuzz.sh

fmt:
	cargo fmt
	cargo fmt --manifest-path tests/sessions/Cargo.toml

clean:
	cargo clean
	cargo clean --manifest-path tests/sessions/Cargo.toml
