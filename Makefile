# pg_lease — every target installs what it needs (scripts/setup.sh).
.PHONY: setup build install test demo fmt clean

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

fmt:
	cargo fmt
	cargo fmt --manifest-path tests/sessions/Cargo.toml

clean:
	cargo clean
	cargo clean --manifest-path tests/sessions/Cargo.toml
