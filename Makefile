# pg_lease — every target installs what it needs (scripts/setup.sh).
.PHONY: setup build install test demo bench fmt clean

setup:
	scripts/setup.sh

build: setup
	cargo build

install: setup
	cargo pgrx install --pg-config "$$(command -v pg_config)"

test:
	scripts/test.sh

demo:
	scripts/demo.sh

bench:
	scripts/setup.sh bench
	python3 bench/run.py

fmt:
	cargo fmt
	cargo fmt --manifest-path tests/sessions/Cargo.toml

clean:
	cargo clean
	cargo clean --manifest-path tests/sessions/Cargo.toml
