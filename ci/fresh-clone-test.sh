#!/usr/bin/env bash
# What CI does, on this machine: clone the committed HEAD into a temporary
# folder (no .venv, no work/, nothing uncommitted) and run the README's test
# command there.  Run it before pushing: `bash ci/fresh-clone-test.sh`.
# Reuses pip's download cache, nothing else.  KEEP=1 keeps the clone.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
dest=$(mktemp -d "${TMPDIR:-/tmp}/series-ci.XXXXXX")
trap '[ "${KEEP:-}" = 1 ] || rm -rf "$dest"' EXIT
git clone -q "$src" "$dest/repo"
cd "$dest/repo"
echo "fresh clone of $(git rev-parse --short HEAD) in $dest/repo"
start=$(date +%s)
.ci/run
echo "make test passed in $(( $(date +%s) - start )) s"
