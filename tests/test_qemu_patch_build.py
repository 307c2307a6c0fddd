"""The patched QEMU's build keeps its configured tree: a new patch rewrites only the files
whose content changes (ninja then recompiles what depends on them), checked on a small
tree against the plain result of applying the new patch to pristine sources."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kvcxl.qemu.qemu_patch import HEADER_PATH, patched_paths, repatch

PRISTINE = {
    "hw/a.c": "int a;\nint a2;\n",
    "hw/b.c": "int b;\n",
    "util/c.c": "int c;\n",
    "util/d.c": "int d;\n",
}


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def _diff(tmp: Path, changed: dict[str, str]) -> str:
    """A ``diff -ruN a b`` patch turning the pristine files into ``changed``."""
    a, b = tmp / "pa", tmp / "pb"
    shutil.rmtree(a, ignore_errors=True)
    shutil.rmtree(b, ignore_errors=True)
    _write(a, PRISTINE)
    _write(b, {**PRISTINE, **changed})
    r = subprocess.run(["diff", "-ruN", "pa", "pb"], cwd=tmp, capture_output=True, text=True)
    return r.stdout


@pytest.mark.skipif(shutil.which("patch") is None, reason="needs patch(1)")
def test_repatch_rewrites_only_what_changes(tmp_path) -> None:
    old = _diff(tmp_path, {"hw/a.c": "int a;\nint a2; /* old */\n", "hw/b.c": "int b2;\n"})
    new = _diff(tmp_path, {"hw/a.c": "int a;\nint a2; /* new */\n", "util/c.c": "int c2;\n",
                           "hw/new.c.inc": "int n;\n"})  # fmt: skip
    assert patched_paths(new) == ["hw/a.c", "hw/new.c.inc", "util/c.c"]
    src = tmp_path / "tree"
    _write(src, PRISTINE)
    subprocess.run(["patch", "-s", "-p1"], input=old.encode(), cwd=src, check=True)
    (src / HEADER_PATH).parent.mkdir(parents=True, exist_ok=True)
    (src / HEADER_PATH).write_text("header 1\n")
    before = {p: p.stat().st_mtime_ns for p in src.rglob("*") if p.is_file()}

    changed = repatch(src, old, new, "header 1\n")

    assert sorted(changed) == ["hw/a.c", "hw/b.c", "hw/new.c.inc", "util/c.c"]
    # the tree is the pristine sources with the new patch, byte for byte
    plain = tmp_path / "plain"
    _write(plain, PRISTINE)
    subprocess.run(["patch", "-s", "-p1"], input=new.encode(), cwd=plain, check=True)
    for p in plain.rglob("*"):
        if p.is_file():
            assert (src / p.relative_to(plain)).read_text() == p.read_text(), p
    # untouched files keep their time stamps: ninja leaves them alone
    assert (src / "util/d.c").stat().st_mtime_ns == before[src / "util/d.c"]
    assert (src / HEADER_PATH).stat().st_mtime_ns == before[src / HEADER_PATH]
    # the same patch again: nothing rewritten; a new header: only the header
    assert repatch(src, new, new, "header 1\n") == []
    assert repatch(src, new, new, "header 2\n") == [HEADER_PATH]


@pytest.mark.skipif(shutil.which("patch") is None, reason="needs patch(1)")
def test_a_tree_that_does_not_take_the_patch_is_refused(tmp_path) -> None:
    old = _diff(tmp_path, {"hw/a.c": "int a;\nint a2; /* old */\n"})
    src = tmp_path / "tree"
    _write(src, PRISTINE)  # the old patch was never applied: reversing it fails
    with pytest.raises(subprocess.CalledProcessError):
        repatch(src, old, old, "h\n")
