"""The wheel carries every package of the one namespace and the data files the commands use."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from parts import FOLDERS  # setup.py's folders

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_contents(tmp_path):
    # Built from a copy of the sources: building in the tree would reuse (and leave) a
    # build/ folder whose stale modules a later wheel would ship.
    src = tmp_path / "src"
    shutil.copytree(
        ROOT, src,
        ignore=shutil.ignore_patterns(
            ".venv", "build", ".git", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis",
            "out", "sim_build", "dist",
        ),
    )  # fmt: skip
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(src),
        ],
        check=True,
    )
    (wheel,) = tmp_path.glob("kvcxl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {n for n in names if n.endswith(".py")}
    sources = {
        f"kvcxl/{p.relative_to(ROOT).as_posix()}"
        for folder in FOLDERS
        for p in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert modules == sources, (modules - sources, sources - modules)
    for folder in FOLDERS:
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.relative_to(ROOT)
            assert f"kvcxl/{rel.as_posix()}" in names, rel
    for data in (
        "qemu/guest/agent.c",
        "qemu/guest/init.sh",
        "qemu/guest/kvcxl_ring.h",
        "qemu/guest/kvcxl_pattern.h",
        "qemu/plugin/kvcxl_plugin.c",
        "model/prompts/long-doc.json",
        "emu/workloads/data/mooncake/conversation_trace.jsonl.xz",
        "emu/workloads/data/mooncake/LICENSE-APACHE",
    ):
        assert f"kvcxl/{data}" in names, data
    assert any(n.endswith("entry_points.txt") for n in names)
