"""Package discovery for the one ``kvcxl`` namespace mapped onto the design card's folders.

Metadata lives in pyproject.toml; this only lists every package below each folder so
that a new sub-package needs no edit here.
"""

from pathlib import Path

from setuptools import setup

FOLDERS = ("common", "cxl", "firmware", "emu", "model", "experiments", "rtl", "tb", "qemu", "cli")
root = Path(__file__).parent
package_dir = {f"kvcxl.{f}": f for f in FOLDERS}
packages = [
    "kvcxl." + ".".join(init.parent.relative_to(root).parts)
    for f in FOLDERS
    for init in sorted((root / f).rglob("__init__.py"))
]
setup(package_dir=package_dir, packages=packages)
