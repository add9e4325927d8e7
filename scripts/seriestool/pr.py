"""``pr``: one pull-request group of the series as a branch ``pr/<group>``,
and its description in vLLM's template (README: "Proposing a patch upstream").
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from . import apply as apply_mod
from . import base as base_mod
from . import check_manifest, hints, interrupts, journal, patchset, scratch, seriestest
from . import export as export_mod
from . import git as g
from . import manifest as manifest_mod
from .errors import SeriesError

# The title line of a section of a patch message, e.g. "Validation (CPU)".
TITLE = re.compile(r"(What changes|Why|Contract|Compatibility|Validation)( \(.*\))?")


def make_pr(repo: Path, manifest: manifest_mod.Manifest, name: str,
            patch_dir: Path = manifest_mod.PATCH_DIR, signoff: bool = False,
            log=print) -> Path:  # fmt: skip
    """Create branch ``pr/<name>`` in ``repo`` and write its description; returns its
    path.  A refusal or a signal changes nothing."""
    with interrupts.deferred() as guard:
        repo = g.checkout_top(repo)  # pr/<group> is a branch of the whole repository
        problems = check_manifest.problems(manifest, patch_dir)
        if problems := problems + manifest_mod.group_problems(manifest):
            raise SeriesError(
                "the manifest or the patch files are not consistent; run"
                f" `{hints.make('check-manifest')}`:\n  " + "\n  ".join(problems)
            )
        groups = {group.name: group for group in manifest.groups}
        if name not in groups or not groups[name].upstream:
            why = "is fork-only: not meant to go upstream" if name in groups else "is no group"
            why = f"{name!r} {why}" if name else "GROUP= names the group to propose"
            listing = [f"  {x.name} ({'upstream' if x.upstream else 'fork-only'}): {x.why}"
                       for x in manifest.groups]  # fmt: skip
            raise SeriesError(f"{why}; the groups:\n" + "\n".join(listing))
        journal.refuse_leftover(repo)
        branch = f"pr/{name}"
        if g.rev(repo, f"refs/heads/{branch}"):
            raise SeriesError(
                f"branch {branch} already exists in {repo}; move it aside, keeping its commits"
                f" (`{hints.git(repo, 'branch', '-m', branch, branch + '-old')}`), and run again"
                f" (`{hints.git(repo, 'branch', '-D', branch)}` would delete its commits,"
                " yours among them if you added any)"
            )
        base = export_mod.resolve_base(repo, manifest, None, manifest.branch_name)
        entries = manifest_mod.group_patches(manifest, name)
        files = [patch_dir / p.file for p in entries]
        images = patchset.images(files)
        identity = g.user_identity(repo)
        paths = sorted(manifest.base.touched_files)
        with scratch.checkout(repo, base, paths) as work:
            # The whole series leaves every patch's preimage for the placement check.
            patchset.am(work, manifest.patch_paths(patch_dir))
            g.git(work, "reset", "-q", "--hard", base)
            commits = scratch.apply_patches(work, files, images, f"{base[:12]}", identity)
            text = describe(work, groups[name], entries, commits, files)
            if signoff:
                author = {"GIT_AUTHOR_NAME": identity["GIT_COMMITTER_NAME"],
                          "GIT_AUTHOR_EMAIL": identity["GIT_COMMITTER_EMAIL"]}  # fmt: skip
                g.git(work, "rebase", "-q", "--exec",
                      "git commit -q --amend --no-edit --reset-author -s", base,
                      env={**identity, **author})  # fmt: skip
            tip = g.out(work, "rev-parse", "HEAD")
            g.git(work, "config", "uploadpack.allowAnySHA1InWant", "true")
            g.git(repo, "fetch", "-q", "--no-tags", "--no-write-fetch-head", "--no-auto-gc",
                  str(work), tip)  # fmt: skip
        # The one change to the checkout, atomic (and only if the branch is
        # still absent): no journal is needed to undo half of it.
        g.git(repo, "update-ref", "-m", "seriestool pr", f"refs/heads/{branch}", tip, "0" * 40)
        guard.completed()
    out = base_mod.WORK_DIR / "pr" / f"{name}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    signed = g.out(repo, "log", "--format=%an <%ae>%x00%(trailers:key=Signed-off-by,valueonly)%x01",
                   f"{base}..{tip}").split("\x01")  # fmt: skip
    unsigned = [who for who, _, by in (e.strip("\n").partition("\0") for e in signed if e.strip())
                if who not in by.splitlines()]  # fmt: skip
    if unsigned:
        again = hints.make("pr", GROUP=name, VLLM=None if repo == apply_mod.default_checkout()
                           else str(repo), SIGNOFF="1")  # fmt: skip
        log(
            f"branch {branch} in {repo}: {len(commits)} patches on {base[:12]}, NOT ready for"
            f" vLLM's DCO check: {len(unsigned)} of its commits carry no Signed-off-by of their"
            " author.  Sign them off as yourself (the branch moved aside first):\n    "
            f"{hints.git(repo, 'branch', '-m', branch, branch + '-unsigned')} && {again}"
        )
    else:
        log(f"branch {branch} in {repo}: {len(commits)} patches on {base[:12]}, ready to push")
    log(f"pull-request description: {out}")
    return out


def describe(work: Path, group: manifest_mod.Group, entries, commits, files) -> str:
    """The pull request's description in vLLM's template, from the commit messages."""
    own = {manifest_mod.normalise(s) for s in group.patches}
    purpose, plan, result, deps = [], [], [], []
    for entry, commit, patch in zip(entries, commits, files, strict=True):
        if manifest_mod.normalise(entry.subject) not in own:
            deps.append(f"- {entry.subject}")
            continue
        body = g.out(work, "show", "-s", "--format=%b", commit).splitlines()
        body = [f"**{line}**" if TITLE.fullmatch(line) else line for line in body
                if not line.startswith("Signed-off-by:")]  # fmt: skip
        cut = next((n for n, line in enumerate(body) if line.startswith("**Validation")), len(body))
        purpose += [f"### {entry.subject}", "", *body[:cut]]
        result += [f"### {entry.subject}", "", *body[cut:], ""]
        plan += [t for t in patchset.files_touched(work, patch) if seriestest.is_test_file(t)]
    if group.depends:
        purpose[:0] = [
            f"Depends on the pull requests of {', '.join(group.depends)}, whose commits come"
            " first on this branch:", *deps, "",
        ]  # fmt: skip
    command = "VLLM_TARGET_DEVICE=cpu python -m pytest -q -rs " + " ".join(sorted(set(plan)))
    text = ["## Purpose", "", *purpose, "## Test Plan", "", "```sh", command, "```", ""]
    return "\n".join([*text, "## Test Result", "", *result]).rstrip("\n") + "\n"


def run(args: argparse.Namespace) -> int:
    manifest = manifest_mod.load()
    repo = args.vllm or apply_mod.ensure_default_checkout(manifest)
    make_pr(repo, manifest, args.group, signoff=args.signoff)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("pr", help="one pull-request group as a branch, with its description")
    p.add_argument("--group", default="", help="the group's name (patches/series.json)")
    p.add_argument(
        "--vllm", type=hints.user_path, help="vLLM checkout (default: work/vllm from make apply)"
    )
    p.add_argument("--signoff", action="store_true", help="re-sign the commits as yourself")
    p.set_defaults(func=run)
