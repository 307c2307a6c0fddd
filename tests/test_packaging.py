"""The wheel carries every package of the one namespace and the data files the commands use."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("firmware", "emu", "rtl", "tb", "qemu")


@pytest.mark.slow
def test_wheel_contents(tmp_path):
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
            str(ROOT),
        ],
        check=True,
    )
    (wheel,) = tmp_path.glob("kvcxl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in FOLDERS:
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.relative_to(ROOT)
            assert f"kvcxl/{rel.as_posix()}" in names, rel
    for data in (
        "qemu/guest/agent.c",
        "qemu/guest/init.sh",
        "qemu/guest/kvcxl_ring.h",
        "qemu/plugin/kvcxl_plugin.c",
        "emu/model/prompts/long-doc.json",
    ):
        assert f"kvcxl/{data}" in names, data
    assert any(n.endswith("entry_points.txt") for n in names)
