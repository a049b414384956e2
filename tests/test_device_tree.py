"""`benchmarks/device-tree`: hides every file of a checkout from the device calls (git's index emptied, every path
ignored) and puts it back exactly; refuses a checkout with changes. Run on a throwaway git repository."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "device-tree"

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def device_tree(repo: Path, action: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), action], cwd=repo, capture_output=True, text=True)


@pytest.fixture
def repo(tmp_path):
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.email", "t@example.com")
    git(tmp_path, "config", "user.name", "t")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("a = 1\n")
    (tmp_path / ".gitignore").write_text("/build/\n")
    (tmp_path / ".git" / "info" / "exclude").write_text("/.rm01/\n")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "one")
    (tmp_path / ".rm01").mkdir()
    (tmp_path / ".rm01" / "part_00").write_bytes(b"x")
    return tmp_path


def travelling(repo: Path) -> set[str]:
    """What a device call carries without `carry`: tracked files and untracked files git does not ignore."""
    return set(git(repo, "ls-files").split()) | set(git(repo, "ls-files", "--others", "--exclude-standard").split())


def test_hide_leaves_nothing_to_travel_and_restore_puts_the_checkout_back(repo):
    before = (travelling(repo), (repo / ".git" / "info" / "exclude").read_text(), git(repo, "rev-parse", "HEAD"))
    assert before[0] == {".gitignore", "src/a.py"}
    hidden = device_tree(repo, "hide")
    assert hidden.returncode == 0, hidden.stdout + hidden.stderr
    assert travelling(repo) == set() and (repo / "src" / "a.py").read_text() == "a = 1\n"  # files stay on disk
    assert git(repo, "rev-parse", "HEAD") == before[2]
    assert "hidden" in device_tree(repo, "status").stdout
    again = device_tree(repo, "hide")
    assert again.returncode == 2 and "already hidden" in again.stdout
    restored = device_tree(repo, "restore")
    assert restored.returncode == 0, restored.stdout + restored.stderr
    after = (travelling(repo), (repo / ".git" / "info" / "exclude").read_text(), git(repo, "rev-parse", "HEAD"))
    assert after == before
    assert git(repo, "status", "--porcelain") == "" and device_tree(repo, "status").stdout.strip() == "not hidden"
    assert device_tree(repo, "restore").returncode == 2


@pytest.mark.parametrize("change", ["edit", "stage", "untracked"])
def test_hide_refuses_a_checkout_with_changes(repo, change):
    if change == "untracked":
        (repo / "src" / "b.py").write_text("b = 2\n")
    else:
        (repo / "src" / "a.py").write_text("a = 2\n")
        if change == "stage":
            git(repo, "add", "src/a.py")
    result = device_tree(repo, "hide")
    assert result.returncode == 2 and "commit (or remove) them first" in result.stdout
    assert "src/a.py" in travelling(repo)  # nothing was hidden
