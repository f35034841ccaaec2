#!/bin/sh
# Fails when clients/typescript/src/gen differs from what `buf generate`
# makes from proto/ now. Generates into a temporary directory, never in place.
# Needs buf ($BUF, default .tools/node_modules/.bin/buf, installed by `make`)
# and protoc-gen-es (`npm ci --prefix clients/typescript`).
set -eu
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
buf=${BUF:-.tools/node_modules/.bin/buf}
gen=clients/typescript/src/gen
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
"$buf" generate --template buf.gen.yaml --output "$tmp"
if diff -r "$gen" "$tmp/$gen" >"$tmp/diff"; then
  echo "typescript codegen: up to date"
else
  cat "$tmp/diff"
  echo "typescript codegen: $gen is stale; run \`make ts-gen\` and commit the result" >&2
  exit 1
fi
