#!/usr/bin/env bash
# Qualify the series on the GPU machine (see scripts/device/run_all.py).
# Device tool: command "bash scripts/device/run_all.sh", carry [".device"].
# Kept plain on purpose: no output redirection tricks, no background jobs.
set -u
cd "$(dirname "$0")/../.." || exit 2
if [ ! -f .device/bundle.json ]; then
    echo "no .device/bundle.json: run 'make device-bundle' and carry .device" >&2
    exit 2
fi
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/qual-out}"
mkdir -p "$OUT"
# A hard stop under the device tool's 600 s, in case everything else fails.
exec timeout -k 10 570 python3 scripts/device/run_all.py --out "$OUT" "$@"
