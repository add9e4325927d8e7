"""The journal's rollback puts back what git itself may not track: a work-tree
file's permission bits under ``core.fileMode=false``."""

from __future__ import annotations

from seriestool import journal


def test_rollback_restores_a_users_chmod_under_filemode_false(make_repo):
    repo = make_repo("vllm", {"run.sh": "echo base\n", "pkg/loader.py": "X = 1\n"})
    repo.git("config", "core.fileMode", "false")
    script = repo.path / "run.sh"
    script.chmod(0o755)  # the user's chmod +x, which git does not record here
    assert repo.git("status", "--porcelain") == ""

    tx = journal.Transaction.begin(repo.path, "apply", {}, journal.Scope(paths={"run.sh": None}))
    script.unlink()  # what a checkout of another version does: a new file, umask mode
    script.write_text("echo series\n")
    script.chmod(0o644)
    tx.rollback()

    assert script.read_text() == "echo base\n"
    assert script.stat().st_mode & 0o777 == 0o755
    assert not (repo.path / ".git" / journal.JOURNAL).exists()
