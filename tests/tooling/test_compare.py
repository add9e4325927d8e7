"""``seriestool compare`` on throw-away repositories.

A toy upstream (the vLLM stand-in, passed as ``--vllm``: it holds the base)
and a toy project repository whose ``patches/`` holds version 1 of a
three-patch series, then a version 2 shaped as each test names it (and, where
a test says so, its manifest's "previous": which v1 patches each v2 patch
derives from).  The real CLI runs; the tests read its JSON (or text) and
check each patch's kind in the draft changelog and the pair git's range-diff
(or the recorded pairing) shows for it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import GIT, ROOT, Repo, snapshot
from seriestool import base as base_mod
from seriestool import check_manifest, cli, versions
from seriestool import export as export_mod
from seriestool import manifest as manifest_mod

LOADER = "".join(f"loader_{n:02d} = {n}\n" for n in range(1, 31))
RELOAD = "".join(f"reload_{n:02d} = {n}\n" for n in range(1, 31))
BASE_FILES = {
    "pkg/loader.py": LOADER,
    "pkg/reload.py": RELOAD,
    "tests/test_base.py": "def test_base():\n    assert True\n",
}
PLANNER = (
    "def plan_staging(size, ring_bytes=256 << 20):\n"
    "    if size > ring_bytes:\n"
    "        return 'cpu'\n"
    "    return 'ring'\n"
)
PLANNER_TEST = (
    "from pkg.staging import plan_staging\n\n\n"
    "def test_oversized_tensors_load_on_cpu():\n"
    "    assert plan_staging(1 << 30) == 'cpu'\n"
)
LOADER_USES_PLANNER = {n: f"loader_{n:02d} = plan_staging({n})" for n in (20, 21, 22)}

# A patch: (message, {path: whole new content, or {line number: new line}}).
BORROWED = (
    "[Loader] explicit borrowed mode\n\nBorrowed views into the staging ring are opt-in.",
    {
        "pkg/loader.py": {3: "loader_03 = 'borrowed'  # opt-in"},
        "tests/test_borrowed.py": "def test_borrowed_mode_is_opt_in():\n    assert 'borrowed'\n",
    },
)
STAGING = (
    "[Loader] bound GPU staging\n\nTensors larger than the ring load on CPU.",
    {"pkg/staging.py": PLANNER, "tests/test_staging.py": PLANNER_TEST,
     "pkg/loader.py": LOADER_USES_PLANNER},
)  # fmt: skip
OWNED_TEST = "def test_deferred_tensors_are_owned():\n    assert own_copy(10) == 10\n"
OWNED = (
    "[Reload] own deferred tensors\n\nDeferred tensors are copied before the ring is reused.",
    {"pkg/reload.py": {10: "reload_10 = own_copy(10)"}, "tests/test_reload_owned.py": OWNED_TEST},
)
V1 = [BORROWED, STAGING, OWNED]

RELEASE = (
    "[Reload] release sources before processing",
    {
        "pkg/reload.py": {25: "reload_25 = release_sources(25)"},
        "tests/test_release.py": "def test_release_before_processing():\n    assert True\n",
    },
)


def _with(patch, message=None, files=None):
    """``patch`` with another message and/or some of its file edits replaced."""
    return (message or patch[0], {**patch[1], **(files or {})})


# Each case: version 2, the kind of every line of the draft (new patches by
# number, gone ones as "v1 NNNN") and the pairs git's range-diff shows.
CASES = {
    "added": (
        [BORROWED, STAGING, OWNED, RELEASE],
        {"0001": ["unchanged"], "0002": ["unchanged"], "0003": ["unchanged"], "0004": ["new"]},
        {("1", "=", "1"), ("2", "=", "2"), ("3", "=", "3"), ("-", ">", "4")},
    ),
    "dropped": (
        [BORROWED, OWNED],
        {"0001": ["unchanged"], "0002": ["unchanged"], "v1 0002": ["dropped"]},
        {("1", "=", "1"), ("2", "<", "-"), ("3", "=", "2")},
    ),
    "split": (
        [
            BORROWED,
            (
                "[Loader] staging planner",
                {"pkg/staging.py": PLANNER, "tests/test_staging.py": PLANNER_TEST},
            ),
            ("[Loader] loader stages through the planner", {"pkg/loader.py": LOADER_USES_PLANNER}),
            OWNED,
        ],  # fmt: skip
        {"0001": ["unchanged"], "0002": ["split"], "0003": ["split"], "0004": ["unchanged"]},
        {("1", "=", "1"), ("-", ">", "2"), ("2", "!", "3"), ("3", "=", "4")},
    ),
    "reordered": (
        [OWNED, BORROWED, STAGING],
        {"0001": ["reordered"], "0002": ["unchanged"], "0003": ["unchanged"]},
        {("3", "=", "1"), ("1", "=", "2"), ("2", "=", "3")},
    ),
    "reworded": (
        [
            _with(BORROWED, "[Loader] opt-in borrowed mode\n\nBorrowing is explicit."),
            STAGING,
            OWNED,
        ],  # fmt: skip
        {"0001": ["reworded"], "0002": ["unchanged"], "0003": ["unchanged"]},
        {("1", "!", "1"), ("2", "=", "2"), ("3", "=", "3")},
    ),
    "changed code": (
        [
            BORROWED,
            STAGING,
            _with(OWNED, files={"pkg/reload.py": {10: "reload_10 = own_copy(10, pin=1)"}}),
        ],
        {"0001": ["unchanged"], "0002": ["unchanged"], "0003": ["contract changed"]},
        {("1", "=", "1"), ("2", "=", "2"), ("3", "!", "3")},
    ),
    "test only": (
        [
            BORROWED,
            STAGING,
            _with(OWNED, files={"tests/test_reload_owned.py": OWNED_TEST + "    assert 1\n"}),
        ],
        {"0001": ["unchanged"], "0002": ["unchanged"], "0003": ["test only"]},
        {("1", "=", "1"), ("2", "=", "2"), ("3", "!", "3")},
    ),  # fmt: skip
    "context only": (
        [
            _with(
                BORROWED,
                files={"pkg/loader.py": {3: "loader_03 = 'opt-in'", 18: "loader_18 = 'ring'"}},
            ),
            STAGING,
            OWNED,
        ],
        {"0001": ["contract changed"], "0002": ["context only"], "0003": ["unchanged"]},
        {("1", "<", "-"), ("-", ">", "1"), ("2", "!", "2"), ("3", "=", "3")},
    ),  # fmt: skip
    "rewritten under the same subject": (
        [
            BORROWED,
            _with(
                STAGING,
                files={
                    "pkg/staging.py": "RING = 'fixed'\n",
                    "tests/test_staging.py": "def test_ring():\n    assert RING\n",
                    "pkg/loader.py": {5: "loader_05 = 'staged'"},
                },
            ),
            OWNED,
        ],
        {"0001": ["unchanged"], "0002": ["contract changed"], "0003": ["unchanged"]},
        {("1", "=", "1"), ("2", "<", "-"), ("-", ">", "2"), ("3", "=", "3")},
    ),  # fmt: skip
}


@pytest.fixture
def work_dir(tmp_path, monkeypatch):
    """The work folder (bases would be cached there) and the temporary folder
    (scratch checkouts go there), both the test's own."""
    work = tmp_path / "work"
    monkeypatch.setattr(base_mod, "WORK_DIR", work)
    scratch_tmp = tmp_path / "tmp"
    scratch_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch_tmp))
    return work


class Project:
    """The toy upstream (with the base) and the series repository."""

    def __init__(self, upstream: Repo, project: Repo):
        self.upstream, self.project = upstream, project
        self.base = upstream.head()
        self.patch_dir = project.path / "patches"

    def write(self, patches, version: str, previous=None, reexport=False, log=None) -> None:
        """Export ``patches`` (applied in order on the base) into ``patches/``.

        The manifest is a new one recording ``previous``; with ``reexport``,
        the one in ``patches/`` (as `make export` does), at ``version``.
        """
        up = self.upstream
        up.git("checkout", "-q", "-b", "series", self.base)
        for message, edits in patches:
            files = {}
            for path, edit in edits.items():
                if isinstance(edit, dict):
                    lines = (up.path / path).read_text().splitlines(keepends=True)
                    for n, line in edit.items():
                        lines[n - 1] = line + "\n"
                    edit = "".join(lines)
                files[path] = edit
            up.commit(message, files)
        manifest = manifest_mod.Manifest(
            name="toy", version=version, patches=[],
            base=manifest_mod.Base(
                project="toy", version="1.0", upstream_commit=self.base[:9],
                sdist=manifest_mod.Sdist("toy-1.0.tar.gz", "0" * 64),
                commit=self.base, touched_files={},
            ),
            regression_tests=manifest_mod.RegressionTests(), previous=dict(previous or {}),
        )  # fmt: skip
        if reexport:
            manifest = manifest_mod.load(self.patch_dir / "series.json")
            manifest.version = version
        self.patch_dir.mkdir(exist_ok=True)
        export_mod.export_series(up.path, manifest, "series", self.base,
                                 patch_dir=self.patch_dir,
                                 manifest_path=self.patch_dir / "series.json",
                                 log=log or (lambda *_: None))  # fmt: skip
        up.git("checkout", "-q", "main")
        up.git("branch", "-q", "-D", "series")

    def commit(self, patches, version: str, message: str, previous=None) -> str:
        self.write(patches, version, previous)
        return self.project.commit(message)

    def compare(self, capsys, *args: str) -> tuple[int, str, str]:
        """The CLI's exit status, stdout and stderr."""
        argv = ["compare", "--repo", str(self.project.path), "--vllm", str(self.upstream.path)]
        rc = cli.main([*argv, *args])
        out, err = capsys.readouterr()
        return rc, out, err


@pytest.fixture
def project(make_repo, work_dir):
    """Version 1 committed in the series repository."""
    p = Project(make_repo("vllm", BASE_FILES), make_repo("project", {"README.md": "series\n"}))
    p.commit(V1, "1", "Series v1")
    return p


def _draft_kinds(report: dict) -> dict[str, list[str]]:
    """Draft line key (new patch tag, or "v1 NNNN" for a gone one) -> kinds."""
    kinds = {}
    for pair in report["pairs"]:
        if pair["new"]:
            kinds[pair["new"]["tag"]] = pair["kinds"]
        elif not pair["split_into"]:
            kinds[f"v1 {pair['old']['tag']}"] = pair["kinds"]
    return kinds


def _range_diff_pairs(text: str) -> set[tuple[str, str, str]]:
    """(old number, status, new number) of each pair header git printed."""
    header = re.compile(r"^\s*(\d+|-):\s+[-0-9a-f]+ ([=!<>])\s+(\d+|-):", re.MULTILINE)
    return set(header.findall(text))


@pytest.mark.parametrize("case", CASES)
def test_each_kind_of_change_is_in_the_draft_and_the_range_diff(project, capsys, case):
    v2, kinds, pairs = CASES[case]
    project.commit(v2, "2", "Series v2")
    rc, out, _err = project.compare(capsys, "--from", "1", "--to", "2", "--json")
    assert rc == 0
    report = json.loads(out)
    assert _draft_kinds(report) == kinds
    assert _range_diff_pairs(report["range_diff"]) == pairs
    draft = report["draft"]
    assert draft.startswith("## Changes in v2\n")
    for key, line_kinds in kinds.items():
        line = next(line for line in draft.splitlines() if line.startswith(f"- {key} "))
        assert all(f": {k}" in line or f"; {k}" in line for k in line_kinds), line
        assert line.endswith("Why: TODO.") == (line_kinds not in (["unchanged"], ["context only"]))
    assert "dropped" not in draft or case == "dropped"


def test_split_and_paired_by_subject_name_their_counterparts(project, capsys):
    """A split names the old patch and every piece; a patch that range-diff left
    unpaired but kept its subject is paired by subject, with its range-diff."""
    rewritten = _with(
        OWNED,
        files={
            "pkg/reload.py": {28: "reload_28 = 'owned elsewhere'"},
            "tests/test_reload_owned.py": "def test_owned():\n    pass\n",
        },
    )
    v2 = CASES["split"][0][:3] + [rewritten]
    project.commit(v2, "2", "Series v2")
    rc, out, _err = project.compare(capsys, "--from", "1", "--to", "2", "--json")
    report = json.loads(out)
    lines = report["draft"].splitlines()
    split = "split from v1 0002 `[Loader] bound GPU staging` into 0002, 0003"
    assert any(line.startswith("- 0002 `[Loader] staging planner`: " + split) for line in lines)
    assert any(line.startswith("- 0003 ") and split in line for line in lines)
    by_subject = [p for p in report["pairs"] if p["paired_by"] == "subject"]
    assert [(p["old"]["tag"], p["new"]["tag"]) for p in by_subject] == [("0003", "0004")]
    assert _range_diff_pairs(report["range_diff"]) >= {("3", "<", "-"), ("-", ">", "4")}
    assert "\n    ++reload_28 = 'owned elsewhere'\n" in by_subject[0]["range_diff"]


# v1 0002 rewritten: range-diff leaves the two unpaired ("rewritten under the
# same subject" above), and the new subject keeps subject pairing out of it.
RING = (
    "[Loader] fixed staging ring\n\nOne ring of fixed size; no CPU fallback.",
    {
        "pkg/staging.py": "RING = 'fixed'\n",
        "tests/test_staging.py": "def test_ring():\n    assert RING\n",
        "pkg/loader.py": {5: "loader_05 = 'staged'"},
    },
)
RING_CHECK = ("[Loader] check the ring size", {"pkg/loader.py": {7: "loader_07 = ring_size()"}})
RING_SUBJECT = RING[0].split("\n")[0]
STAGING_V1 = STAGING[0].split("\n")[0]
OWNED_V1 = OWNED[0].split("\n")[0]


def _pair_of(report: dict, new_tag: str) -> dict:
    return next(p for p in report["pairs"] if p["new"] and p["new"]["tag"] == new_tag)


def _draft_line(report: dict, new_tag: str) -> str:
    return next(line for line in report["draft"].splitlines() if line.startswith(f"- {new_tag} "))


def test_draft_lists_documentation_apart_from_code(project, capsys):
    """A rewrite that also changes docs: "docs differ in" lists docs/ and
    Markdown or reStructuredText files, not "code differs in"."""
    ring_with_docs = (RING[0], {**RING[1], "docs/staging.md": "# Staging\n\nOne ring.\n",
                                "pkg/README.rst": "Staging\n=======\n"})  # fmt: skip
    project.commit([BORROWED, ring_with_docs, OWNED], "2", "Series v2",
                   previous={RING_SUBJECT: [STAGING_V1]})  # fmt: skip
    rc, out, _err = project.compare(capsys, "--from", "1", "--to", "2", "--json")
    assert rc == 0
    assert _draft_line(json.loads(out), "0002") == (
        "- 0002 `[Loader] fixed staging ring`: rewritten from v1 0002 `[Loader] bound GPU"
        " staging`: contract changed: code differs in pkg/loader.py, pkg/staging.py; docs"
        " differ in docs/staging.md, pkg/README.rst; tests differ in tests/test_staging.py;"
        " message changed too. Why: TODO."
    )


def test_a_rewrite_recorded_in_previous_is_paired_with_its_range_diff(project, capsys):
    """range-diff leaves v1 0002 and its rewrite unpaired; the entry in
    "previous" pairs them: their range-diff under its own heading, the draft
    says "rewritten from", and v1 0002 is not listed as dropped."""
    v2 = [BORROWED, RING, OWNED]
    project.commit(v2, "2", "Series v2", previous={RING_SUBJECT: [STAGING_V1]})
    rc, out, _err = project.compare(capsys, "--from", "1", "--to", "2", "--json")
    assert rc == 0
    report = json.loads(out)
    assert _range_diff_pairs(report["range_diff"]) >= {("2", "<", "-"), ("-", ">", "2")}
    pair = _pair_of(report, "0002")
    assert (pair["status"], pair["old"]["tag"], pair["paired_by"]) == ("!", "0002", "manifest")
    assert pair["kinds"] == ["rewritten", "contract changed"]
    assert "\n    -+    if size > ring_bytes:\n" in pair["range_diff"]
    assert "\n    ++RING = 'fixed'\n" in pair["range_diff"]
    assert _draft_line(report, "0002") == (
        "- 0002 `[Loader] fixed staging ring`: rewritten from v1 0002 `[Loader] bound GPU"
        " staging`: contract changed: code differs in pkg/loader.py, pkg/staging.py; tests"
        " differ in tests/test_staging.py; message changed too. Why: TODO."
    )
    assert "dropped" not in report["draft"] and report["notes"] == []
    rc, text, _err = project.compare(capsys, "--from", "1", "--to", "2")
    heading = (
        "paired as recorded in series.json (range-diff left them unpaired): v1 0002 -> v2 0002"
    )
    assert f"\n{heading}\n{pair['range_diff']}\n" in text
    assert re.search(
        r"^0002\s+!\s+0002\s+rewritten, contract changed\s+\[Loader\] fixed", text, re.M
    )


def test_a_split_recorded_in_previous_reads_as_split_with_its_range_diff(project, capsys):
    """Two new patches record v1 0002: the first is paired with it, the other
    is not paired again but reads "split from ... (recorded)" and still gets
    its range-diff against v1 0002."""
    v2 = [BORROWED, RING, RING_CHECK, OWNED]
    previous = {RING_SUBJECT: [STAGING_V1], RING_CHECK[0]: [STAGING_V1]}
    project.commit(v2, "2", "Series v2", previous=previous)
    rc, out, _err = project.compare(capsys, "--from", "1", "--to", "2", "--json")
    assert rc == 0
    report = json.loads(out)
    assert _pair_of(report, "0002")["paired_by"] == "manifest"
    piece = _pair_of(report, "0003")
    assert (piece["status"], piece["old"], piece["paired_by"]) == (">", None, None)
    assert (piece["kinds"], piece["split_into"], piece["recorded_from"]) == (
        ["split"], ["0002", "0003"], ["0002"]
    )  # fmt: skip
    [derivation] = piece["derivations"]
    assert derivation["old"]["tag"] == "0002"
    assert "\n    ++loader_07 = ring_size()\n" in derivation["range_diff"]
    assert _draft_line(report, "0003") == (
        "- 0003 `[Loader] check the ring size`: split from v1 0002 `[Loader] bound GPU staging`"
        " (recorded; pieces: 0002, 0003). Why: TODO."
    )
    assert "dropped" not in report["draft"]
    rc, text, _err = project.compare(capsys, "--from", "1", "--to", "2")
    heading = (
        "split as recorded in series.json (v1 0002 is paired with v2 0002): v1 0002 -> v2 0003"
    )
    assert f"\n{heading}\n{derivation['range_diff']}\n" in text


def test_a_merge_recorded_in_previous_pairs_the_first_and_consumes_the_rest(project, capsys):
    """A new patch recording two v1 patches is paired with the first; the
    second is merged into it (its range-diff shown), not listed as dropped."""
    merged = ("[Loader] staging and ownership", {**RING[1], **OWNED[1]})
    project.commit([BORROWED, merged], "2", "Series v2",
                   previous={merged[0]: [STAGING_V1, OWNED_V1]})  # fmt: skip
    rc, out, _err = project.compare(capsys, "--from", "1", "--to", "2", "--json")
    assert rc == 0
    report = json.loads(out)
    pair = _pair_of(report, "0002")
    assert (pair["old"]["tag"], pair["paired_by"], pair["recorded_from"]) == (
        "0002", "manifest", ["0002", "0003"]
    )  # fmt: skip
    assert pair["kinds"] == ["rewritten", "contract changed", "merged"]
    gone = next(p for p in report["pairs"] if p["old"] and p["old"]["tag"] == "0003")
    assert (gone["status"], gone["kinds"], gone["merged_into"]["tag"]) == ("<", ["merged"], "0002")
    line = _draft_line(report, "0002")
    assert line.startswith("- 0002 `[Loader] staging and ownership`: rewritten from v1 0002 ")
    assert "; also from v1 0003 `[Reload] own deferred tensors` (recorded). Why: TODO." in line
    assert "- v1 0003" not in report["draft"]
    rc, text, _err = project.compare(capsys, "--from", "1", "--to", "2")
    assert (
        "\nmerged as recorded in series.json (v2 0002 is paired with v1 0002): v1 0003 -> v2 0002\n"
        in text
    )


def test_a_recorded_ancestor_that_names_no_old_patch_is_a_note(project, capsys):
    """An entry whose old subject is mistyped pairs nothing and says so."""
    project.commit([BORROWED, RING, OWNED], "2", "Series v2",
                   previous={RING_SUBJECT: ["[Loader] bound GPU stagign"]})  # fmt: skip
    rc, out, _err = project.compare(capsys, "--from", "1", "--to", "2", "--json")
    report = json.loads(out)
    assert rc == 0 and _pair_of(report, "0002")["kinds"] == ["new"]
    v1, v2 = project.project.git("rev-parse", "HEAD~1", "HEAD").split()
    assert report["notes"] == [
        f"series.json of v2 (commit {v2[:12]}) records 0002 `{RING_SUBJECT}` as derived from"
        f" `[Loader] bound GPU stagign`, which is no patch of v1 (commit {v1[:12]}): check the"
        ' subject in "previous"'
    ]


def test_against_an_older_version_previous_names_the_one_between_and_warns_of_nothing(
    project, capsys
):
    """FROM=1 with v3 recording v2's subjects: no note on entries that are right."""
    project.commit([BORROWED, RING, OWNED], "2", "Series v2",
                   previous={RING_SUBJECT: [STAGING_V1]})  # fmt: skip
    project.commit([BORROWED, RING], "3", "Series v3", previous={RING_SUBJECT: [RING_SUBJECT]})
    rc, out, _err = project.compare(capsys, "--from", "1", "--to", "3", "--json")
    assert rc == 0 and json.loads(out)["notes"] == []
    rc, out, _err = project.compare(capsys, "--from", "2", "--to", "3", "--json")
    assert rc == 0 and json.loads(out)["notes"] == []


@pytest.mark.parametrize(
    "previous, expected",
    [
        ({"[Loader] bound GPU stagign": [STAGING_V1]},
         "\"series\".\"previous\" names '[Loader] bound GPU stagign', which is not the subject"
         " of any patch of this manifest (its keys are this version's subjects); did you mean"
         " '[Loader] bound GPU staging'?"),
        ({STAGING_V1: []},
         "\"series\".\"previous\"['[Loader] bound GPU staging'] must be a non-empty list"),
        ({STAGING_V1: STAGING_V1},
         "\"series\".\"previous\"['[Loader] bound GPU staging'] must be a non-empty list"),
    ],
    ids=["unknown subject", "empty list", "not a list"],
)  # fmt: skip
def test_an_invalid_previous_fails_check_manifest_naming_it(project, previous, expected):
    """check-manifest, with the system python3 alone, names the bad entry."""
    path = project.patch_dir / "series.json"
    data = json.loads(path.read_text())
    data["series"]["previous"] = previous
    path.write_text(json.dumps(data, indent=2) + "\n")
    done = subprocess.run(
        ["python3", "-m", "seriestool", "check-manifest", "--manifest", str(path)],
        env=dict(os.environ, PYTHONPATH=str(ROOT / "scripts")), capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith(f"error: manifest {path}:\n  ")
    assert expected in done.stderr


def test_export_keeps_previous_and_drops_entries_of_patches_gone(project):
    """Re-exporting keeps "previous" as it was (order included); the entry of
    a patch the new export no longer has is dropped, with a note."""
    previous = {OWNED_V1: [OWNED_V1], RING_SUBJECT: [STAGING_V1]}
    project.commit([BORROWED, RING, OWNED], "2", "Series v2", previous=previous)
    path = project.patch_dir / "series.json"
    assert manifest_mod.load(path).previous == previous
    notes = []
    project.write([BORROWED, RING], "2", reexport=True, log=notes.append)
    project.project.commit("v2: drop a patch")
    saved = manifest_mod.load(path)
    assert list(saved.previous.items()) == [(RING_SUBJECT, [STAGING_V1])]
    assert [n for n in notes if n.startswith("note:")] == [
        "note: dropped \"previous\" entry '[Reload] own deferred tensors' from the manifest: no"
        " patch has that subject any more"
    ]
    assert check_manifest.problems(saved, project.patch_dir) == []
    before = path.read_bytes()
    project.write([BORROWED, RING], "2", reexport=True)
    assert path.read_bytes() == before


@pytest.mark.parametrize("manifest", ["toy v1", "this repository's v1"])
def test_a_manifest_without_previous_is_byte_identical_after_load_and_save(
    project, tmp_path, manifest
):
    """A manifest written before "previous" existed round-trips byte for byte."""
    if manifest == "toy v1":
        text = (project.patch_dir / "series.json").read_bytes()
    else:
        state = versions.resolve(ROOT, "1")
        text = subprocess.run([GIT, "-C", str(ROOT), "show", f"{state.commit}:patches/series.json"],
                              capture_output=True, check=True).stdout  # fmt: skip
    assert b'"previous"' not in text
    src, dest = tmp_path / "in.json", tmp_path / "out.json"
    src.write_bytes(text)
    loaded = manifest_mod.load(src)
    assert loaded.previous == {}
    loaded.save(dest)
    assert dest.read_bytes() == text


@pytest.mark.parametrize("spec", ["1", "v1", "first v1 commit", "2", "HEAD~1"])
def test_a_version_is_found_by_number_or_by_commit(project, capsys, spec):
    """Version N is the newest commit whose manifest says N (the v1 message fix
    here, not the first v1 commit); a commit-ish names its own state."""
    first_v1 = project.project.git("rev-parse", "HEAD")
    reworded = [_with(BORROWED, "[Loader] explicit borrowed mode\n\nFixed wording."), STAGING,
                OWNED]  # fmt: skip
    v1_fixed = project.commit(reworded, "1", "v1: fix a message")
    project.project.commit("README only", {"README.md": "more\n"})
    v2 = project.commit(CASES["added"][0], "2", "Series v2")
    project.project.commit("README again", {"README.md": "again\n"})
    expected = {"1": v1_fixed, "v1": v1_fixed, "first v1 commit": first_v1, "2": v2,
                "HEAD~1": v2}  # fmt: skip
    given = first_v1[:10] if spec == "first v1 commit" else spec
    rc, out, _err = project.compare(capsys, "--from", given, "--json")
    assert rc == 0
    report = json.loads(out)
    assert report["from"]["commit"] == expected[spec]
    assert report["from"]["version"] == ("1" if expected[spec] != v2 else "2")
    assert report["to"]["commit"] is None and report["to"]["label"] == "v2 (working tree)"


@pytest.mark.parametrize("spec", ["3", "no-such-ref", "initial commit"])
def test_an_unknown_version_is_refused_naming_the_versions_that_exist(project, capsys, spec):
    initial = project.project.git("rev-list", "--max-parents=0", "HEAD")
    v1 = project.project.head()
    v2 = project.commit(CASES["added"][0], "2", "Series v2")
    given = initial if spec == "initial commit" else spec
    rc, out, err = project.compare(capsys, "--from", given)
    assert rc == 2 and out == ""
    assert (
        f"versions in its history, newest first: 2 (commit {v2[:12]}), 1 (commit {v1[:12]})" in err
    )
    reason = {
        "3": "no series version 3 in the history of",
        "no-such-ref": "'no-such-ref' is neither a series version nor a commit of",
        "initial commit": f"commit {initial[:12]} ({initial}) has no readable patches/series.json",
    }[spec]
    assert reason in err


@pytest.mark.parametrize("base", ["moved on", "nowhere"])
def test_a_version_that_cannot_be_applied_is_refused(project, capsys, monkeypatch, work_dir, base):
    """Exit 2, nothing on stdout: a version whose patch does not apply on the
    base it pins names the version and the patch; a base that is neither in
    --vllm nor cached, and cannot be fetched, names the base and the fix."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # nothing may be fetched
    loader = LOADER.replace("loader_03 = 3", "loader_03 = 'three'")
    moved = project.upstream.commit("upstream moves on", {"pkg/loader.py": loader})
    manifest = json.loads((project.patch_dir / "series.json").read_text())
    manifest["series"]["version"] = "2"
    manifest["base"]["commit"] = moved if base == "moved on" else "f" * 40
    project.project.commit("Series v2", {"patches/series.json": json.dumps(manifest)})
    rc, out, err = project.compare(capsys, "--from", "1", "--to", "2")
    assert rc == 2 and out == ""
    label = f"v2 (commit {project.project.head()[:12]})"
    if base == "moved on":
        patch = "0001-Loader-explicit-borrowed-mode.patch"
        assert f"error: {label}: patch {patch} does not apply on its pinned base toy 1.0" in err
        assert f" ({moved[:12]}): " in err
    else:
        assert f"error: {label} pins the base toy 1.0 (commit ffffffffffff)" in err
        assert f"It is not cached in {work_dir}/base/toy-1.0.git" in err and " venv`" in err


def test_json_is_the_whole_stdout_and_lists_both_sides(project, capsys):
    project.commit(CASES["changed code"][0], "2", "Series v2")
    rc, out, _err = project.compare(capsys, "--from", "1", "--to", "2", "--json")
    report = json.loads(out)
    assert rc == 0 and set(report) >= {"from", "to", "pairs", "range_diff", "draft", "summary"}
    assert [(p["tag"], p["status"], p["paired_with"]) for p in report["from"]["patches"]] == [
        ("0001", "=", "0001"), ("0002", "=", "0002"), ("0003", "!", "0003"),
    ]  # fmt: skip
    assert [p["subject"] for p in report["to"]["patches"]] == [
        "[Loader] explicit borrowed mode", "[Loader] bound GPU staging",
        "[Reload] own deferred tensors",
    ]  # fmt: skip
    changed = [p for p in report["pairs"] if p["status"] == "!"]
    assert [p["code_paths"] for p in changed] == [["pkg/reload.py"]]
    assert "\n    -+reload_10 = own_copy(10)\n" in changed[0]["range_diff"]
    assert "\n    ++reload_10 = own_copy(10, pin=1)\n" in changed[0]["range_diff"]
    assert all(p["range_diff"] is None for p in report["pairs"] if p["status"] == "=")
    assert report["summary"] == {"unchanged": 2, "contract changed": 1}


def test_text_report_and_the_draft_written_to_a_file(project, capsys, tmp_path):
    project.commit(CASES["dropped"][0], "2", "Series v2")
    rc, out, _err = project.compare(capsys, "--from", "1", "--to", "2")
    assert rc == 0
    assert re.search(r"^0002\s+<\s+-\s+dropped\s+\[Loader\] bound GPU staging$", out, re.M)
    assert re.search(r"^2:  [0-9a-f]{12} < -:  -{12} \[Loader\] bound GPU staging$", out, re.M)
    assert "- v1 0002 `[Loader] bound GPU staging`: dropped. Why: TODO." in out
    draft = tmp_path / "draft.md"
    rc, out2, _err = project.compare(capsys, "--from", "1", "--to", "2", "--draft", str(draft))
    assert rc == 0 and f"written to {draft}" in out2 and "## Changes in v2" not in out2
    assert draft.read_text() in out and draft.read_text().startswith("## Changes in v2\n")


def test_the_users_checkout_is_only_read(project, capsys, work_dir):
    """Uncommitted v2 in the working tree, a staged change, untracked files and
    a stash: all exactly as before, in both repositories; no scratch left, and
    nothing written to the work folder."""
    project.write(CASES["split"][0], "2")
    project.project.write({"README.md": "staged edit\n"})
    project.project.git("add", "README.md")
    project.project.write({"notes.txt": "untracked\n"})
    project.upstream.write({"pkg/loader.py": "user edit\n"})
    project.upstream.git("stash", "-q")
    before = snapshot(project.project), snapshot(project.upstream)
    rc, out, _err = project.compare(capsys, "--from", "1")
    assert rc == 0 and "split from v1 0002" in out
    assert (snapshot(project.project), snapshot(project.upstream)) == before
    assert list(Path(tempfile.gettempdir()).iterdir()) == []
    assert not work_dir.exists()


def _plain_git(repo: Repo, *args: str) -> str:
    """git as the user's shell runs it: their configuration and environment."""
    return subprocess.run([GIT, "-C", str(repo.path), *args], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


def test_output_does_not_depend_on_user_git_configuration(project, capsys, tmp_path, monkeypatch):
    """A global config, an attributes file, config from the environment and
    in the repositories, an identity in the environment, hooks and templates
    that fail: the report is byte-identical to a plain run."""
    project.commit(CASES["split"][0], "2", "Series v2")
    rc, plain, _err = project.compare(capsys, "--from", "1", "--to", "2")
    assert rc == 0 and "split from v1 0002" in plain
    hooks = tmp_path / "template" / "hooks"
    hooks.mkdir(parents=True)
    for name in ("applypatch-msg", "pre-applypatch", "post-applypatch", "commit-msg"):
        (hooks / name).write_text("#!/bin/sh\necho hook ran >&2\nexit 1\n")
        (hooks / name).chmod(0o755)
    attributes = tmp_path / "attributes"
    attributes.write_text("*.py diff=hostile\n")
    config = tmp_path / "hostile.gitconfig"
    config.write_text(
        # Not pinned by the tooling: hunk headers and hunk merging change.
        f"[core]\n\tattributesFile = {attributes}\n"
        '[diff "hostile"]\n\txfuncname = "^(loader_0[0-9].*)$"\n'
        "[diff]\n\tinterHunkContext = 10\n"
        # Hooks and templates that would make `git am` fail.
        f"[core]\n\thooksPath = {hooks}\n"
        f"[init]\n\ttemplateDir = {hooks.parent}\n"
        # Pinned already; here to keep them so.
        "[core]\n\tabbrev = 5\n[color]\n\tui = always\n"
        "[diff]\n\tcontext = 9\n\talgorithm = patience\n\texternal = /bin/false\n"
        "[am]\n\tmessageId = true\n\tthreeWay = false\n"
        "[user]\n\tname = Someone Else\n\temail = else@example.com\n"
    )
    order = tmp_path / "order"
    order.write_text("tests/*\n")
    for repo in (project.project, project.upstream):
        repo.git("config", "core.abbrev", "9")
        repo.git("config", "log.decorate", "full")
        repo.git("config", "diff.orderFile", str(order))
    with monkeypatch.context() as m:
        m.setenv("GIT_CONFIG_GLOBAL", str(config))
        m.setenv("GIT_CONFIG_COUNT", "1")
        m.setenv("GIT_CONFIG_KEY_0", "diff.noprefix")
        m.setenv("GIT_CONFIG_VALUE_0", "true")
        m.setenv("GIT_EXTERNAL_DIFF", "/bin/false")
        # Who commits, and when: kept for commits in the user's checkout, never
        # for the scratch commits whose ids the range-diff shows.
        m.setenv("GIT_COMMITTER_NAME", "Someone Else")
        m.setenv("GIT_COMMITTER_EMAIL", "else@example.com")
        m.setenv("GIT_COMMITTER_DATE", "2030-06-01T12:00:00+0000")
        m.setenv("GIT_AUTHOR_NAME", "Someone Else")
        m.setenv("GIT_AUTHOR_DATE", "2030-06-01T12:00:00+0000")
        # The configuration is in effect for plain git calls ...
        assert _plain_git(project.upstream, "config", "core.hooksPath") == str(hooks)
        assert _plain_git(project.upstream, "config", "diff.noprefix") == "true"
        check_attr = _plain_git(project.upstream, "check-attr", "diff", "pkg/loader.py")
        assert check_attr.endswith("hostile")
        # ... and changes nothing in the comparison.
        rc, hostile, _err = project.compare(capsys, "--from", "1", "--to", "2")
    assert rc == 0
    assert hostile == plain


def test_make_compare_on_this_repository_needs_no_venv(make_work_dir, tmp_path):
    """`make compare` on this repository's own history (from the oldest commit
    whose series is on the pinned base, to the committed HEAD, not whatever the
    working tree holds), the base cached in the work folder: no `make venv`
    runs (there is no venv at all here, so python3 runs the tool), pip is never
    asked (no index), and with JSON=1 stdout is the report alone."""

    def base_of(commit: str) -> str:
        manifest = Repo(ROOT).git("show", f"{commit}:patches/series.json")
        return json.loads(manifest)["base"]["version"]

    head = Repo(ROOT).head()
    on_base = [c for c, _ in versions.history(ROOT) if base_of(c) == base_of(head)]
    no_venv = tmp_path / "no-venv"
    env = dict(os.environ, SERIES_WORK_DIR=str(make_work_dir), PIP_NO_INDEX="1")
    done = subprocess.run(
        ["make", "-s", "-C", str(ROOT), "compare", f"FROM={on_base[-1]}", "TO=HEAD",
         "JSON=1", f"VENV={no_venv}"],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["from"]["commit"] == on_base[-1] and report["from"]["patches"]
    assert report["to"]["commit"] == head
    assert report["draft"].startswith(f"## Changes in v{report['to']['version']}\n")
    assert not no_venv.exists()
    assert sorted(p.name for p in make_work_dir.iterdir()) == ["base", "sdist", "vllm"]
