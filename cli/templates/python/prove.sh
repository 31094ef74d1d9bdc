#!/bin/sh
# Builds {{name}} and crash-tests it with `idem prove`: a clean run, then one dropped at
# every crash point of every step, each in a scratch store over a copy of ./data.
# Exits 0 when every item was written exactly once in every scenario, 7 when not.
# Needs componentize-py and idem on PATH (`pip install` of the idem wheel brings both).
set -eu
cd "$(dirname "$0")"
componentize-py componentize app -o {{name}}.wasm
mkdir -p data
idem prove {{name}}.wasm --dir ./data::/data --input @input.json "$@"
