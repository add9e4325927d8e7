#!/usr/bin/env bash
# Qualify the series on the GPU machine (see scripts/device/run_all.py).
# Run from a copy of scripts/device and .device/ (make device-bundle).
# Kept plain on purpose: no output redirection tricks, no background jobs.
set -u
cd "$(dirname "$0")/../.." || exit 2
if [ ! -f .device/bundle.json ]; then
    echo "no .device/bundle.json: run 'make device-bundle' and copy .device/ here" >&2
    exit 2
fi
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/qual-out}"
mkdir -p "$OUT"
# A hard stop past run_all.py's own budget, in case everything else fails.
exec timeout -k 10 570 python3 scripts/device/run_all.py --out "$OUT" "$@"
