"""`make restore` after apply was killed: it undoes the apply, and nothing else.

apply is killed (``os._exit``, as SIGKILL: no clean-up runs) once it has
switched the checkout but before it drops its journal.  The user then works
in the checkout.  ``make restore`` must refuse to undo that work (listing it,
changing nothing, keeping the journal) and print a ``FORCE=1`` command that,
pasted, restores the checkout anyway.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT, snapshot

# apply, killed after its last change to the checkout, before the journal goes.
KILLED_APPLY = """
import os, sys
from pathlib import Path

sys.path.insert(0, {scripts!r})
from seriestool import apply, journal, manifest

journal.Transaction.commit = lambda self: os._exit(137)
repo, patch_dir = Path(sys.argv[1]), Path(sys.argv[2])
apply.apply_series(repo, manifest.load(patch_dir / "series.json"), patch_dir)
""".format(scripts=str(ROOT / "scripts"))


@pytest.fixture
def killed_apply(toy_series, tmp_path):
    """The toy checkout as a killed apply left it, and its state before the apply."""
    repo, _manifest, patch_dir = toy_series
    repo.write({"notes.txt": "untracked notes\n"})
    before = snapshot(repo)
    env = dict(os.environ, SERIES_WORK_DIR=str(tmp_path / "work"))
    proc = subprocess.run([sys.executable, "-c", KILLED_APPLY, str(repo.path), str(patch_dir)],
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 137, proc.stdout + proc.stderr
    assert snapshot(repo) != before
    return repo, before


def _restore(repo, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "seriestool", "restore", "--vllm", str(repo.path), *extra],
        env=dict(os.environ, PYTHONPATH=str(ROOT / "scripts")),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _force_command(output: str) -> str:
    commands = [line[4:] for line in output.splitlines() if re.match(r"^    \S", line)]
    assert len(commands) == 1, output
    assert "FORCE=1" in commands[0], output
    return commands[0]


def test_restore_after_a_kill_undoes_the_apply_exactly(killed_apply):
    repo, before = killed_apply
    done = _restore(repo)
    assert done.returncode == 0, done.stderr
    assert snapshot(repo) == before


@pytest.mark.parametrize("change", ["file", "branch", "config", "commit", "stash"])
def test_restore_refuses_to_undo_work_done_after_the_kill(killed_apply, tmp_path, change):
    repo, before = killed_apply
    if change == "file":  # a file the series does not touch
        repo.write({"pkg/other.py": "VALUE = 'mine'\n"})
        expected = "pkg/other.py: modified"
    elif change == "branch":
        repo.git("branch", "my-work")
        expected = "refs/heads/my-work: created"
    elif change == "config":
        repo.git("config", "remote.fork.url", "https://example.com/fork.git")
        expected = "config: remote.fork.url added"
    elif change == "commit":  # on the series branch apply made
        repo.commit("my fix", {"pkg/loader.py": "def load(x):\n    return 2 * x\n"})
        expected = "refs/heads/"
    else:
        repo.write({"pkg/loader.py": "def load(x):\n    return -x\n"})
        repo.git("stash", "push", "-q")
        expected = "refs/stash: created"
    after = snapshot(repo)
    refused = _restore(repo)
    assert refused.returncode != 0
    assert expected in refused.stderr, refused.stderr
    assert "nothing was changed" in refused.stderr
    assert snapshot(repo) == after, "a refusal must change nothing, the journal included"

    # The printed FORCE=1 command works as pasted, and says what it discarded.
    command = _force_command(refused.stderr)
    forced = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert expected in forced.stdout, forced.stdout
    assert snapshot(repo) == before


def test_restore_ignores_file_stats_changed_since_the_kill(killed_apply):
    """Touching a file (or copying the checkout) is not work to keep."""
    repo, before = killed_apply
    for path in ("pkg/other.py", "pkg/loader.py"):
        os.utime(repo.path / path, (0, 0))
    done = _restore(repo)
    assert done.returncode == 0, done.stderr
    assert snapshot(repo)["files"] == before["files"]
    assert snapshot(repo)["branches"] == before["branches"]


def test_restore_takes_a_killed_but_unreaped_apply_for_ended(killed_apply):
    """SIGKILLed, the apply may linger as a zombie until its parent reaps it:
    it changes nothing any more, so restore must not wait for it."""
    import json
    import time
    from pathlib import Path

    repo, before = killed_apply
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # never waited for
    stat = Path(f"/proc/{zombie.pid}/stat")
    for _ in range(500):
        if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.01)
    else:
        pytest.fail("the child did not become a zombie")
    data = repo.path / ".git" / "seriestool-journal" / "journal.json"
    journal = json.loads(data.read_text())
    journal["pid"] = zombie.pid
    data.write_text(json.dumps(journal))
    try:
        done = _restore(repo)
        assert done.returncode == 0, done.stderr
        assert snapshot(repo) == before
    finally:
        zombie.wait()
