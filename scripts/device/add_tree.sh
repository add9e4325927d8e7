#!/usr/bin/env bash
# Add an earlier series to .device/ as an extra vLLM tree, for run_all.py's
# bound phase: by default the series as of commit e1378a4, which still has
# "InstantTensor: large tensors stream through a bounded ring in pieces", as
# the tree "pieces".
#
#   make device-bundle                      # .device/ of the series as it is
#   bash scripts/device/add_tree.sh [COMMIT [NAME]]
#
# It runs `make device-bundle` in a temporary worktree of COMMIT (its .venv a
# link to this checkout's; SERIES_WORK_DIR this checkout's work/ unless set,
# so the materialised base and the cached wheels are reused), copies that
# bundle's trees/series.tar.xz to .device/trees/NAME.tar.xz and lists it in
# .device/bundle.json's trees as the others are listed (an overlay of the
# base, with its patches, files, deleted and changed), plus the commit.  It
# refuses when COMMIT's series pins another base commit than .device's.
# About 2 minutes and 0.5 GiB of temporary disk (the worktree, its bundle)
# when the trees are not cached yet; seconds when they are.
set -euo pipefail
commit="${1:-e1378a4}"
name="${2:-pieces}"
root="$(git rev-parse --show-toplevel)"
cd "$root"
if [ ! -f .device/bundle.json ]; then
    echo "no .device/bundle.json: run 'make device-bundle' first" >&2
    exit 2
fi
case "$name" in
    base | series | before-*)
        echo "refusing to replace the bundle's own tree $name" >&2
        exit 2
        ;;
esac
full="$(git rev-parse --verify "$commit^{commit}")"
venv="${VENV:-$root/.venv}"
if [ ! -x "$venv/bin/python" ]; then
    echo "no $venv/bin/python: run 'make venv' first" >&2
    exit 2
fi
export SERIES_WORK_DIR="${SERIES_WORK_DIR:-$root/work}"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/add-tree.XXXXXX")"
cleanup() {
    git worktree remove --force "$tmp/wt" >/dev/null 2>&1 || true
    rm -rf "$tmp"
    git worktree prune
}
trap cleanup EXIT
git worktree add --detach -q "$tmp/wt" "$full"
ln -s "$(cd "$venv" && pwd -P)" "$tmp/wt/.venv"
start=$(date +%s)
make -C "$tmp/wt" device-bundle
echo "make device-bundle at ${full:0:12}: $(($(date +%s) - start)) s," \
    "$(du -sh "$tmp" | cut -f1) in $tmp"
python3 - "$tmp/wt/.device" .device "$name" "$full" <<'PY'
import json
import shutil
import sys
from pathlib import Path

old_dir, new_dir, name, commit = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
old = json.loads((old_dir / "bundle.json").read_text())
new = json.loads((new_dir / "bundle.json").read_text())
if old["base"]["commit"] != new["base"]["commit"]:
    sys.exit(
        f"{commit[:12]}'s series is on base {old['base']['commit'][:12]}, .device's on"
        f" {new['base']['commit'][:12]}: the tree would not overlay this bundle's base"
    )
tree = old["trees"].get("series")
if tree is None:
    sys.exit(f"{commit[:12]} has no series (a base-only bundle)")
archive = f"trees/{name}.tar.xz"
shutil.copy2(old_dir / tree["archive"], new_dir / archive)
new["trees"][name] = {**tree, "archive": archive, "commit": commit}
tmp = new_dir / "bundle.json.tmp"
tmp.write_text(json.dumps(new, indent=1) + "\n")
tmp.replace(new_dir / "bundle.json")
size = (new_dir / archive).stat().st_size / 2**20
print(
    f"{new_dir}/{archive}: {size:.1f} MiB, the series of {commit[:12]}"
    f" ({len(tree.get('patches', []))} patches) as tree {name!r} in bundle.json"
)
PY
