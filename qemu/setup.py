"""``kvcxl setup`` step for the virtual host: QEMU ≥ 10, the 6.12 guest kernel, the initramfs.

What it does, each part skipped when already done (a manifest of input hashes
under the cache decides):

1. Debian packages: ``qemu-system-x86`` ≥ 10 (bookworm-backports on Debian 12,
   main on 13), ``busybox-static``, ``ndctl`` and ``daxctl`` (the guest's ``cxl``
   and ``daxctl``), gcc with static libc, glib headers (for the TCG plugin).
2. The guest kernel ``linux-image-6.12.*-amd64``, fetched with ``apt-get download``
   and unpacked into the cache — never installed on the host.  The 6.1 kernel
   enumerates the device but cannot create a volatile region.
3. ``qemu-plugin.h`` from the same QEMU version's upstream tarball
   (``apt-get source --download-only``; no Debian package ships the header).
4. The static guest agent, the TCG plugin (optional: ring-only mode without it)
   and the initramfs (busybox, cxl/daxctl with their libraries, the CXL and DAX
   modules decompressed, the agent, /init).
5. The patched QEMU (:mod:`kvcxl.qemu.qemu_patch`): the same tarball, the patch
   of ``qemu/patch/``, ``x86_64-softmmu`` with TCG and plugins only (about 6
   minutes on 2 cores, once; rebuilt only when the patch or its tables change).

Everything lands in ``$KVCXL_CACHE/qemu`` (default ``~/.cache/kvcxl/qemu``).
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from kvcxl.common.cachedir import cache_root

from . import qemu_patch

HERE = Path(__file__).parent
GUEST_DIR = HERE / "guest"
PLUGIN_DIR = HERE / "plugin"
QEMU_MIN_MAJOR = 10
KERNEL_SERIES = "6.12"
# Load order of the guest's CXL/DAX stack (none has a dependency outside this list
# in Debian's 6.12 build; setup checks the modules' own ``depends=`` to be sure).
MODULES = ("cxl_acpi", "cxl_pci", "cxl_mem", "device_dax", "kmem", "dax_cxl")
MODULE_DIRS = ("drivers/cxl", "drivers/dax")
MANIFEST = "manifest.json"
APT_SOURCE = Path("/etc/apt/sources.list.d/kvcxl-qemu.sources")


class SetupError(RuntimeError):
    # `kvcxl` prints it as one line with this exit status (a failed run, not bad input).
    exit_code = 1

    """The host cannot be prepared; the message says what to do."""


@dataclass(frozen=True)
class Host:
    """Everything a boot needs, as recorded by :func:`setup`."""

    qemu: str
    qemu_version: str
    kernel: Path
    kernel_version: str
    initramfs: Path
    agent: Path
    plugin: Path | None
    plugin_error: str | None
    qemu_kvcxl: str | None = None  # the patched QEMU (kvcxl= on cxl-type3), when built

    @property
    def plugin_available(self) -> bool:
        return self.plugin is not None


def cache_dir() -> Path:
    return cache_root() / "qemu"


def load_host() -> Host:
    """The host prepared by :func:`setup`; a clear error when setup has not run."""
    path = cache_dir() / MANIFEST
    try:
        m = json.loads(path.read_text())
    except FileNotFoundError:
        raise SetupError(
            f"the virtual host is not set up ({path} missing): run `kvcxl qemu setup` as root"
        ) from None
    host = Host(
        qemu=m["qemu"],
        qemu_version=m["qemu_version"],
        kernel=Path(m["kernel"]),
        kernel_version=m["kernel_version"],
        initramfs=Path(m["initramfs"]),
        agent=Path(m["agent"]),
        plugin=Path(m["plugin"]) if m.get("plugin") else None,
        plugin_error=m.get("plugin_error"),
        qemu_kvcxl=m.get("qemu_kvcxl"),
    )
    for p in (host.kernel, host.initramfs, host.agent):
        if not p.exists():
            raise SetupError(f"{p} is missing: run `kvcxl qemu setup --force`")
    return host


# --- step 1: Debian packages --------------------------------------------------------------
def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


def _os_release() -> dict[str, str]:
    out = {}
    for line in Path("/etc/os-release").read_text().splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            out[k] = v.strip('"')
    return out


def qemu_version(binary: str = "qemu-system-x86_64") -> str | None:
    path = shutil.which(binary)
    if path is None:
        return None
    out = _run([path, "--version"]).stdout
    m = re.search(r"version (\d+\.\d+\.\d+)", out)
    return m.group(1) if m else None


def _packages_ok() -> bool:
    v = qemu_version()
    if v is None or int(v.split(".")[0]) < QEMU_MIN_MAJOR:
        return False
    if not all(shutil.which(b) for b in ("busybox", "cxl", "daxctl", "gcc", "cpio")):
        return False
    if not _is_static(Path(shutil.which("busybox")).resolve()):
        return False  # Debian's dynamic busybox would need its libraries in the initramfs
    if not all(shutil.which(b) for b in ("flex", "bison", "ninja", "patch")):
        return False  # the patched QEMU's build tools
    if not Path("/usr/include/libfdt.h").exists() or not _pkg_ok("pixman-1"):
        return False
    return Path("/usr/lib/x86_64-linux-gnu/libc.a").exists() and _glib_cflags() is not None


def _pkg_ok(name: str) -> bool:
    return shutil.which("pkg-config") is not None and (
        subprocess.run(["pkg-config", "--exists", name]).returncode == 0
    )


def _is_static(path: Path) -> bool:
    """An ELF64 executable without a PT_INTERP program header (no dynamic loader)."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:
            return False
        phoff = int.from_bytes(head[0x20:0x28], "little")
        phentsize = int.from_bytes(head[0x36:0x38], "little")
        phnum = int.from_bytes(head[0x38:0x3A], "little")
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    types = [int.from_bytes(table[i : i + 4], "little") for i in range(0, len(table), phentsize)]
    return 3 not in types  # PT_INTERP


def _glib_cflags() -> list[str] | None:
    if not shutil.which("pkg-config"):
        return None
    r = subprocess.run(["pkg-config", "--cflags", "glib-2.0"], capture_output=True, text=True)
    return r.stdout.split() if r.returncode == 0 else None


def _need_root(what: str) -> None:
    if os.geteuid() != 0:
        raise SetupError(f"{what} needs root: run `kvcxl qemu setup` as root (or sudo)")


def _apt_target() -> tuple[str, str | None]:
    """(codename, apt target release for QEMU 10 and kernel 6.12 or None for main)."""
    codename = _os_release().get("VERSION_CODENAME", "")
    if codename == "bookworm":
        return codename, "bookworm-backports"
    if codename in ("trixie", "forky", "sid"):
        return codename, None
    raise SetupError(
        f"Debian release {codename!r} is not supported: the virtual host needs Debian 12 "
        "(bookworm, with backports) or 13 (trixie)"
    )


def _ensure_apt_source(codename: str, target: str | None) -> None:
    """deb822 source with deb-src (for qemu-plugin.h) and, on bookworm, the backports suite."""
    suites = target if target else codename
    types = "deb deb-src" if target else "deb-src"
    text = (
        f"Types: {types}\nURIs: http://deb.debian.org/debian\nSuites: {suites}\n"
        "Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    )
    if not APT_SOURCE.exists() or APT_SOURCE.read_text() != text:
        APT_SOURCE.write_text(text)
        _apt(["update"])
    elif not list(Path("/var/lib/apt/lists").glob(f"*{suites}*Packages*")):
        _apt(["update"])


def _apt(args: list[str], cwd: Path | None = None, check: bool = True) -> str:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "-q", "-y", "-o", "DPkg::Lock::Timeout=600", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    if check and r.returncode != 0:
        tail = " | ".join(r.stderr.strip().splitlines()[-3:])
        raise SetupError(f"`{' '.join(cmd)}` failed: {tail}")
    return r.stdout


def ensure_packages() -> None:
    if _packages_ok():
        return
    _need_root("installing Debian packages")
    codename, target = _apt_target()
    _ensure_apt_source(codename, target)
    tflag = ["-t", target] if target else []
    _apt(["install", "--no-install-recommends", *tflag, "qemu-system-x86"])
    _apt(
        [
            "install",
            "--no-install-recommends",
            "busybox-static",
            "ndctl",
            "daxctl",
            "gcc",
            "libc6-dev",
            "libglib2.0-dev",
            "pkg-config",
            "cpio",
            "xz-utils",
            # the patched QEMU (qemu/qemu_patch.py); meson and pycotap come from PyPI
            "ninja-build",
            "flex",
            "bison",
            "libpixman-1-dev",
            "libfdt-dev",
            "patch",
        ]
    )
    v = qemu_version()
    if v is None or int(v.split(".")[0]) < QEMU_MIN_MAJOR:
        raise SetupError(f"QEMU {v} installed, but >= {QEMU_MIN_MAJOR} is needed (cxl-type3 RAM)")


# --- step 2: guest kernel ------------------------------------------------------------------
def _kernel_package(target: str | None) -> str:
    tflag = ["-t", target] if target else []
    r = _run(["apt-cache", "depends", *tflag, "linux-image-amd64"])
    m = re.search(r"Depends: (linux-image-(\d+\.\d+)[^\s]*-amd64)\b", r.stdout)
    if not m or m.group(2) != KERNEL_SERIES:
        raise SetupError(
            f"no linux-image-{KERNEL_SERIES}.*-amd64 candidate (apt-cache says "
            f"{m.group(1) if m else 'nothing'}); on Debian 12 enable bookworm-backports"
        )
    return m.group(1)


def ensure_kernel(root: Path) -> tuple[Path, str]:
    """Unpack vmlinuz and the CXL/DAX modules of the 6.12 kernel into ``root/kernel``."""
    kdir = root / "kernel"
    done = kdir / "version"
    if done.exists():
        ver = done.read_text().strip()
        return kdir / f"vmlinuz-{ver}", ver
    codename, target = _apt_target()
    if os.geteuid() == 0:
        _ensure_apt_source(codename, target)
    pkg = _kernel_package(target)
    dl = root / "download"
    dl.mkdir(parents=True, exist_ok=True)
    os.chmod(dl, 0o755)
    tflag = ["-t", target] if target else []
    for old in dl.glob("linux-image-*.deb"):
        old.unlink()
    _apt(["download", *tflag, pkg], cwd=dl, check=False)
    debs = sorted(dl.glob(f"{pkg}_*.deb"))
    if not debs:
        raise SetupError(f"`apt-get download {pkg}` fetched nothing; check the apt sources")
    ver = pkg.removeprefix("linux-image-")
    staging = root / "kernel.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    # Only the kernel and the two module folders: the whole package is ~500 MB unpacked.
    members = [f"./boot/vmlinuz-{ver}"] + [f"./lib/modules/{ver}/kernel/{d}/*" for d in MODULE_DIRS]
    tar_cmd = (
        f"dpkg-deb --fsys-tarfile '{debs[0]}' | tar -x -C '{staging}' --wildcards "
        + " ".join(f"'{m}'" for m in members)
    )
    subprocess.run(["bash", "-o", "pipefail", "-c", tar_cmd], check=True)
    mods = staging / "modules"
    mods.mkdir()
    found = {p.name.removesuffix(".ko.xz"): p for p in staging.rglob("*.ko.xz")}
    for name in MODULES:
        if name not in found:
            raise SetupError(f"module {name} is not in {pkg}")
        data = lzma.decompress(found[name].read_bytes())
        m = re.search(rb"depends=([^\0]*)\0", data)
        deps = [d for d in (m.group(1).decode().split(",") if m else []) if d]
        missing = [d for d in deps if d not in MODULES]
        if missing:
            raise SetupError(f"module {name} depends on {missing}, not in the initramfs list")
        (mods / f"{name}.ko").write_bytes(data)
    shutil.move(staging / "boot" / f"vmlinuz-{ver}", staging / f"vmlinuz-{ver}")
    shutil.rmtree(staging / "boot")
    shutil.rmtree(staging / "lib")
    (staging / "version").write_text(ver + "\n")
    shutil.rmtree(kdir, ignore_errors=True)
    staging.rename(kdir)
    debs[0].unlink()  # 100 MB; the unpacked parts are all we keep
    return kdir / f"vmlinuz-{ver}", ver


# --- step 3: qemu-plugin.h -----------------------------------------------------------------
def qemu_source(root: Path, qver: str) -> Path:
    """The upstream source tarball of QEMU ``qver`` (kept in the cache once fetched)."""
    dl = root / "download"
    tars = sorted(dl.glob(f"qemu_{qver}*.orig.tar.*"))
    if tars:
        return tars[0]
    codename, target = _apt_target()
    if os.geteuid() == 0:
        _ensure_apt_source(codename, target)
    dl.mkdir(parents=True, exist_ok=True)
    os.chmod(dl, 0o755)
    tflag = ["-t", target] if target else []
    # The .dsc may 404 while the orig tarball downloads: judge by the tarball.
    _apt(["source", "--download-only", *tflag, "qemu"], cwd=dl, check=False)
    for extra in (*dl.glob("qemu_*.dsc"), *dl.glob("qemu_*.debian.tar.*")):
        extra.unlink()
    tars = sorted(dl.glob(f"qemu_{qver}*.orig.tar.*"))
    if not tars:
        raise SetupError(f"the QEMU {qver} source tarball could not be downloaded")
    return tars[0]


def ensure_plugin_header(root: Path, qver: str) -> Path:
    """``include/qemu/qemu-plugin.h`` of QEMU ``qver``, from its upstream source tarball."""
    inc = root / "include" / qver
    header = inc / "qemu" / "qemu-plugin.h"
    if header.exists():
        return inc
    tar = qemu_source(root, qver)
    with tarfile.open(tar) as tf:
        for member in tf:
            if member.name.endswith("include/qemu/qemu-plugin.h"):
                header.parent.mkdir(parents=True, exist_ok=True)
                header.write_bytes(tf.extractfile(member).read())
                break
    if not header.exists():
        raise SetupError(f"{tar.name} has no include/qemu/qemu-plugin.h")
    return inc


# --- step 4: builds ------------------------------------------------------------------------
def build_agent(out: Path) -> Path:
    src = GUEST_DIR / "agent.c"
    cmd = ["gcc", "-static", "-O2", "-Wall", "-Wextra", "-Werror", "-std=gnu11"]
    _run([*cmd, "-I", str(GUEST_DIR), "-o", str(out), str(src)])
    return out


def build_plugin(out: Path, include: Path) -> Path:
    cflags = _glib_cflags()
    if cflags is None:
        raise SetupError("glib-2.0 headers not found (libglib2.0-dev, pkg-config)")
    src = PLUGIN_DIR / "kvcxl_plugin.c"
    cmd = ["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-std=gnu11"]
    _run([*cmd, *cflags, "-I", str(include), "-I", str(GUEST_DIR), "-o", str(out), str(src)])
    return out


def _ldd(binary: str) -> list[Path]:
    out = _run(["ldd", binary]).stdout
    libs = []
    for line in out.splitlines():
        m = re.search(r"(/\S+) \(0x", line)
        if m:
            libs.append(Path(m.group(1)))
    return libs


def build_initramfs(out: Path, modules: Path, agent: Path) -> Path:
    """A newc cpio (gzip) with busybox, cxl, daxctl + libraries, the modules, agent, /init."""
    stage = out.parent / "initramfs.d"
    shutil.rmtree(stage, ignore_errors=True)
    for d in ("bin", "sbin", "etc", "proc", "sys", "dev", "tmp", "lib/modules", "usr/bin", "run"):
        (stage / d).mkdir(parents=True)
    shutil.copy2(shutil.which("busybox"), stage / "bin" / "busybox")
    for tool in ("cxl", "daxctl"):
        path = shutil.which(tool)
        shutil.copy2(path, stage / "usr" / "bin" / tool)
        for lib in _ldd(path):
            dest = stage / lib.relative_to("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(lib.resolve(), dest)
    for name in MODULES:
        shutil.copy2(modules / f"{name}.ko", stage / "lib" / "modules" / f"{name}.ko")
    (stage / "etc" / "kvcxl-modules").write_text(" ".join(MODULES) + "\n")
    shutil.copy2(agent, stage / "bin" / "kvcxl-agent")
    shutil.copy2(GUEST_DIR / "init.sh", stage / "init")
    os.chmod(stage / "init", 0o755)
    files = sorted(str(p.relative_to(stage)) for p in stage.rglob("*"))
    cpio = subprocess.run(
        ["cpio", "-o", "-H", "newc", "--quiet", "-R", "0:0"],
        input=("\n".join(files) + "\n").encode(),
        cwd=stage,
        capture_output=True,
        check=True,
    )
    # Uncompressed: gunzip of 5 MB under TCG costs the guest ~6 s of boot.
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(cpio.stdout)
    tmp.rename(out)
    shutil.rmtree(stage)
    return out


def _inputs_hash(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
    for d in (GUEST_DIR, PLUGIN_DIR):
        for f in sorted(d.glob("*")):
            if f.is_file():
                h.update(f.name.encode())
                h.update(f.read_bytes())
    return h.hexdigest()[:16]


def setup(force: bool = False) -> Host:
    """Prepare the virtual host (idempotent; fast when done).  Returns what a boot needs."""
    root = cache_dir()
    if force:
        shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    ensure_packages()
    qver = qemu_version()
    kernel, kver = ensure_kernel(root)
    digest = _inputs_hash(qver, kver, qemu_patch.fingerprint())
    mpath = root / MANIFEST
    if mpath.exists():
        try:
            old = json.loads(mpath.read_text())
            if old.get("inputs") == digest:
                return load_host()
        except (ValueError, KeyError, SetupError):
            pass
    build = root / "build"
    build.mkdir(exist_ok=True)
    agent = build_agent(build / "kvcxl-agent")
    plugin: Path | None = None
    plugin_error = None
    try:
        inc = ensure_plugin_header(root, qver)
        plugin = build_plugin(build / "libkvcxl-plugin.so", inc)
    except (SetupError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", None) or str(exc)
        plugin_error = f"TCG plugin not built ({detail.strip()[-300:]}); ring-only mode"
        print(f"setup qemu: {plugin_error}")
    initramfs = build_initramfs(build / "initramfs.cpio", kernel.parent / "modules", agent)
    # The patched QEMU (kvcxl= on cxl-type3): a failure here is the setup's failure, since
    # `kvcxl qemu boot` uses it unless --qemu stock is asked for.
    qemu_kvcxl = qemu_patch.build(root, qemu_source(root, qver), qver)
    manifest = {
        "inputs": digest,
        "qemu": shutil.which("qemu-system-x86_64"),
        "qemu_version": qver,
        "kernel": str(kernel),
        "kernel_version": kver,
        "initramfs": str(initramfs),
        "agent": str(agent),
        "plugin": str(plugin) if plugin else None,
        "plugin_error": plugin_error,
        "qemu_kvcxl": str(qemu_kvcxl),
    }
    mpath.write_text(json.dumps(manifest, indent=2) + "\n")
    return load_host()
