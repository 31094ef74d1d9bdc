#!/bin/sh
# Builds {{name}} and crash-tests it with `idem prove`: a clean run, then one dropped at
# every crash point of every step, each in a scratch store over a copy of ./data.
# Exits 0 when every item was written exactly once in every scenario, 7 when not.
set -eu
cd "$(dirname "$0")"
cargo build --release --target wasm32-wasip2
mkdir -p data
idem prove "${CARGO_TARGET_DIR:-target}/wasm32-wasip2/release/{{crate}}.wasm" \
    --dir ./data::/data --input @input.json "$@"
