"""Materialise a vLLM release from its PyPI sdist as one reproducible commit
(fixed identity, dates, message), cached as a bare repository in ``work/base``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

from . import git as g
from . import interrupts
from .errors import SeriesError
from .manifest import ROOT

WORK_DIR = Path(os.environ.get("SERIES_WORK_DIR", ROOT / "work")).absolute()

# Fixed identity of the base commit: with these, the commit id depends only on
# the sdist's content.
BASE_IDENTITY = {
    "GIT_AUTHOR_NAME": "vLLM sdist import",
    "GIT_AUTHOR_EMAIL": "sdist-import@series.invalid",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "vLLM sdist import",
    "GIT_COMMITTER_EMAIL": "sdist-import@series.invalid",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}
BASE_BRANCH = "base"


def sha256_of(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def sdist_filename(project: str, version: str) -> str:
    return f"{project}-{version}.tar.gz"


def pip_download(dest: Path, *args: str, env=None) -> tuple[int, list[str]]:
    """``pip download --no-deps`` into ``dest``: (exit status, its stderr's else stdout's lines)."""
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar=off"]
    cmd = [*pip, "--disable-pip-version-check", "-d", str(dest), *args]
    proc = interrupts.run(cmd, capture_output=True, text=True, env=env)
    return proc.returncode, (proc.stderr or proc.stdout).strip().splitlines()


def fetch_sdist(
    project: str,
    version: str,
    sha256: str | None,
    dest_dir: Path,
    pip_args: Sequence[str] = (),
) -> tuple[Path, str]:
    """Download ``project==version``'s sdist into ``dest_dir`` with pip; returns it
    and its sha256 (``sha256``: the one it must have; None: the index's)."""
    requirement = f"{project}=={version}"
    args = ["--no-binary=:all:", "--no-build-isolation", *pip_args, requirement]
    if sha256:
        req_file = dest_dir / "requirement.txt"
        req_file.write_text(f"{requirement} --hash=sha256:{sha256}\n")
        args[-1:] = ["--require-hashes", "-r", str(req_file)]
    env = dict(os.environ, VLLM_TARGET_DEVICE="empty", VLLM_VERSION_OVERRIDE=version)
    rc, detail = pip_download(dest_dir, *args, env=env)
    if rc != 0:
        hint = ""
        if any("DO NOT MATCH THE HASHES" in line for line in detail):
            hint = (
                f"\nThe sdist {sdist_filename(project, version)} does not have the"
                f" pinned sha256 {sha256}: refusing it. If upstream re-published"
                " the file, verify it and update patches/series.json deliberately."
            )
        raise SeriesError(
            f"pip could not fetch the sdist of {requirement}:\n  " + "\n  ".join(detail[-8:]) + hint
        )
    path = dest_dir / sdist_filename(project, version)
    if not path.exists():
        raise SeriesError(f"pip ran but left no {path.name} in {dest_dir}")
    return path, sha256_of(path)  # pip checked it against ``sha256`` (--require-hashes)


def upstream_commit_in(version_py: str) -> str | None:
    """The abbreviated upstream commit that a ``vllm/_version.py``'s text records."""
    match = re.search(r"commit_id\s*=\s*['\"]g?([0-9a-f]+)['\"]", version_py)
    return match.group(1) if match else None


def unpack(sdist: Path, dest: Path) -> Path:
    """Unpack ``sdist`` under ``dest`` (tarfile's safe ``data`` filter); returns its
    single top-level folder."""
    try:
        shutil.unpack_archive(sdist, dest, filter="data")
    except (tarfile.TarError, shutil.ReadError) as e:
        raise SeriesError(f"cannot unpack {sdist.name} safely: {e}") from None
    tops = list(dest.iterdir())
    if len(tops) != 1 or not tops[0].is_dir():
        raise SeriesError(f"{sdist.name} does not unpack to a single folder")
    return tops[0]


def import_tree(tree: Path, repo: Path, message: str) -> str:
    """Record ``tree`` as one commit on ``base`` in bare ``repo``; returns it.  Every
    file, as it is: ``info/attributes`` (ahead of the sdist's ``.gitattributes``)
    turns off every conversion, and ``add --force`` takes what ``.gitignore`` names."""
    g.git(tree.parent, "init", "-q", "--bare", f"--initial-branch={BASE_BRANCH}", str(repo))
    (repo / "info" / "attributes").write_text("* -text -ident -filter -working-tree-encoding\n")
    gd = [f"--git-dir={repo}", f"--work-tree={tree}"]
    index = {"GIT_INDEX_FILE": str(repo / "import-index")}
    g.git(tree, *gd, "add", "--all", "--force", ".", env=index)
    tree_id = g.out(tree, *gd, "write-tree", env=index)
    (repo / "import-index").unlink()
    commit = g.out(tree, *gd, "commit-tree", tree_id, "-m", message, env=BASE_IDENTITY)
    g.git(tree, *gd, "update-ref", f"refs/heads/{BASE_BRANCH}", commit)
    return commit


def base_repo_path(project: str, version: str) -> Path:
    return WORK_DIR / "base" / f"{project}-{version}.git"


def materialise(
    project: str,
    version: str,
    sha256: str | None,
    upstream_commit: str | None = None,
    expected_commit: str | None = None,
    pip_args: Sequence[str] = (),
    log=print,
) -> tuple[Path, str, str]:
    """Return (bare repo, base commit id, sdist sha256), building it if needed in
    a temporary folder renamed into place only when complete."""
    repo = base_repo_path(project, version)
    stamp = repo / "series-sdist-sha256"
    if stamp.exists() and (commit := g.rev(repo, BASE_BRANCH)):
        recorded = stamp.read_text().strip()
        if sha256 and recorded != sha256:
            raise SeriesError(
                f"cached base {repo} was built from an sdist with sha256 {recorded},"
                f" not {sha256}; remove {repo} and run again"
            )
        _check_commit(commit, expected_commit, repo)
        return repo, commit, recorded

    WORK_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="base-", dir=WORK_DIR) as tmp_name:
        tmp = Path(tmp_name)
        log(f"fetching {project}=={version} sdist with pip ...")
        sdist, digest = fetch_sdist(project, version, sha256, tmp, pip_args)
        log(f"sha256 {digest} verified; unpacking ...")
        tree = unpack(sdist, tmp / "tree")
        version_py = tree / "vllm" / "_version.py"
        recorded_commit = (upstream_commit_in(version_py.read_text("utf-8", "replace"))
                           if version_py.is_file() else None)  # fmt: skip
        if upstream_commit and recorded_commit != upstream_commit:
            raise SeriesError(
                f"{sdist.name} records upstream commit {recorded_commit!r}, "
                f"expected {upstream_commit!r}"
            )
        message = (
            f"{project} {version} from PyPI sdist {sdist.name}\n\n"
            f"sha256: {digest}\nupstream commit: {recorded_commit or 'unknown'}\n"
        )
        commit = import_tree(tree, tmp / "repo.git", message)
        _check_commit(commit, expected_commit, sdist)
        (tmp / "repo.git" / "series-sdist-sha256").write_text(digest + "\n")
        repo.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(repo, ignore_errors=True)  # an incomplete earlier attempt without the stamp
        (tmp / "repo.git").rename(repo)
        # Keep the verified sdist: the device bundle packs trees from it.
        (WORK_DIR / "sdist").mkdir(exist_ok=True)
        shutil.move(str(sdist), WORK_DIR / "sdist" / sdist.name)
    log(f"base {project} {version} materialised: {repo} at {commit}")
    return repo, commit, digest


def cached_upstream_commit(project: str, version: str, sha256: str) -> str | None:
    """The upstream commit that the sdist with ``sha256`` records ("": none), read
    from its base ``materialise`` cached; None when no such base is cached."""
    repo = base_repo_path(project, version)
    stamp = repo / "series-sdist-sha256"
    if not sha256 or not stamp.is_file() or stamp.read_text().strip() != sha256:
        return None
    version_py = g.git(repo, "show", f"{BASE_BRANCH}:vllm/_version.py", check=False).stdout
    return upstream_commit_in(version_py) or ""


def materialise_pinned(manifest, pip_args: Sequence[str] = (), log=print) -> tuple[Path, str, str]:
    """``materialise`` the base a ``manifest.Manifest`` pins (version, sdist hash, commits)."""
    b = manifest.base
    return materialise(
        b.project, b.version, b.sdist.sha256, upstream_commit=b.upstream_commit,
        expected_commit=b.commit or None, pip_args=pip_args, log=log,
    )  # fmt: skip


def _check_commit(commit: str, expected: str | None, source) -> None:
    if expected and commit != expected:
        raise SeriesError(
            f"base built from {source} is commit {commit}, but the manifest pins"
            f" {expected}; the import is not reproducible or the manifest is stale"
        )


def clone(base_repo: Path, dest: Path, branch: str = BASE_BRANCH) -> Path:
    """A working checkout of the base, sharing the cache's objects."""
    g.git(base_repo.parent, "clone", "-q", "--shared", "--branch", branch,
          str(base_repo), str(dest))  # fmt: skip
    # No user.* is written: commits the tools make carry an identity per
    # command (``patchset.am``), and the user's own commits theirs.
    return dest
