"""The shape of the code: the harness core knows no day, days share the kit, one launch path.

* imports, parsed from every module's source: no core module (``helpers/``) imports the days
  package; a day imports the core, the kit and earlier days only, and no other day's private
  (underscore) name; the core loads the days only through `helpers.variants.DAYS_PACKAGE`;
* the core's own imports: every one at module level (pycuda and the standard library may load
  lazily), and no circle among its modules;
* no helper is defined twice across the day modules (same body under any name), and no day
  redefines a kit name;
* no kernel file includes another ``.cu`` (a kernel two days use lives in a header, or the
  launch that runs it is built from its own file: `KernelLaunch.cu_file`);
* the kit's argument packing and launch helpers, the build targets of a variant, and `bind`
  (the one place a launch's named buffers become pointers), on the CPU.

Each structural check is also run on a planted violation, to show it can fail.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import RecordingKernel, packed_like_pycuda

import days
from days import kit
from helpers.epilogue import PLAIN, Epilogue
from helpers.launch import Launcher, bind
from helpers.problem import Conv2dProblem
from helpers.variants import DAYS_PACKAGE, Buffer, KernelLaunch, LaunchConfig, Variant, get

ROOT = Path(__file__).resolve().parents[1]
CORE = sorted((ROOT / "helpers").rglob("*.py"))
DAY_FILES = sorted(p for p in (ROOT / "days").rglob("*.py") if p.name != "__init__.py" or p.parent.name != "days")


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _package_of(path: Path) -> list[str]:
    pkg = module_name(path).split(".")
    return pkg if path.name == "__init__.py" else pkg[:-1]


def _is_module(name: str) -> bool:
    """Whether ``name`` is a module or package of this repository (helpers.x, days.x, days.x.y)."""
    rel = Path(*name.split("."))
    return (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file()


def imports(path: Path, source: str | None = None) -> tuple[list[tuple[str, list[str]]], dict[str, str]]:
    """The imports of one file: ([(absolute module, [names taken from it])], {local name: module
    it is bound to}). Relative imports are resolved, and ``from pkg import mod`` counts as
    importing the module ``pkg.mod`` when it is one of this repository's."""
    tree = ast.parse(source if source is not None else path.read_text())
    pkg = _package_of(path)
    out, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out.append((a.name, []))
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = pkg[: len(pkg) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            plain = []
            for a in node.names:
                if _is_module(f"{mod}.{a.name}"):
                    out.append((f"{mod}.{a.name}", []))
                    aliases[a.asname or a.name] = f"{mod}.{a.name}"
                else:
                    plain.append(a.name)
            if plain:
                out.append((mod, plain))
    return out, aliases


def attribute_uses(path: Path, source: str | None = None) -> list[tuple[str, str]]:
    """[(module, attribute)] for every ``alias.attr`` (or ``pkg.mod.attr``) in the file whose
    leading names resolve to one of this repository's modules."""
    tree = ast.parse(source if source is not None else path.read_text())
    _, aliases = imports(path, source)
    uses = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        chain, base = [node.attr], node.value
        while isinstance(base, ast.Attribute):
            chain.insert(0, base.attr)
            base = base.value
        if not isinstance(base, ast.Name) or base.id not in aliases:
            continue
        mod = aliases[base.id]
        for part in chain:  # walk down while the prefix is still a module
            if _is_module(f"{mod}.{part}"):
                mod = f"{mod}.{part}"
            else:
                uses.append((mod, part))
                break
        else:
            uses.append((mod, ""))
    return uses


DYNAMIC = ("__import__", "import_module", "modules")  # __import__(...), importlib.import_module(...), sys.modules[...]


def dynamic_imports(source: str) -> list[str]:
    """Names of the dynamic-import calls or lookups in a source (calls of __import__/import_module,
    subscripts of sys.modules, getattr with a private string)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name in ("__import__", "import_module"):
                found.append(name)
            if name == "getattr" and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
                if str(node.args[1].value).startswith("_"):
                    found.append(f"getattr(..., {node.args[1].value!r})")
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "modules":
            found.append("sys.modules[...]")
    return found


def day_of(module: str) -> int | None:
    """The day number of a days.dayNN_* module (or a module inside a day package), else None."""
    m = re.match(r"days\.day(\d\d)_", module)
    return int(m.group(1)) if m else None


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def core_violations(path: Path, source: str | None = None) -> list[str]:
    """A core module may not import the days (statically, or by __import__/sys.modules); the one
    dynamic import, of the package named `DAYS_PACKAGE`, is `helpers.variants._load_days`."""
    src = source if source is not None else path.read_text()
    bad = [f"{path.name} imports {mod}" for mod, _ in imports(path, src)[0] if mod.split(".")[0] == DAYS_PACKAGE]
    dyn = dynamic_imports(src)
    if path.name != "variants.py":
        bad += [f"{path.name} imports dynamically: {d}" for d in dyn]
    elif dyn != ["import_module"]:
        bad.append(f"variants.py: dynamic imports {dyn}, want only _load_days' import_module(DAYS_PACKAGE)")
    return bad


def day_violations(path: Path, source: str | None = None) -> list[str]:
    """A day imports the core, the kit and earlier days, only their public names (in an import
    or as ``module.name``), and nothing dynamically."""
    src = source if source is not None else path.read_text()
    me = module_name(path)
    my_day = day_of(me)
    mods, _ = imports(path, src)
    bad = [f"{me} imports dynamically: {d}" for d in dynamic_imports(src)]
    refs = [(mod, n) for mod, names in mods for n in names] + [(mod, "") for mod, names in mods if not names]
    for mod, name in refs + attribute_uses(path, src):
        top = mod.split(".")[0]
        if top not in ("helpers", "days"):
            continue
        other = day_of(mod)
        foreign = other is not None and other != my_day
        if foreign and my_day is not None and other > my_day:
            bad.append(f"{me} uses a later day, {mod}")
        if (top == "helpers" or foreign) and _private(name):
            bad.append(f"{me} uses the private {mod}.{name}")
    return sorted(set(bad))


def test_core_imports_no_day_module():
    bad = [v for p in CORE for v in core_violations(p)]
    assert not bad, bad
    # the one way the core reaches the days: importing the package named DAYS_PACKAGE
    users = [p.name for p in CORE if "import_module" in p.read_text()]
    assert users == ["variants.py"], users


def test_days_import_the_core_the_kit_and_earlier_days_publicly():
    assert DAY_FILES, "no day modules found"
    bad = [v for p in DAY_FILES for v in day_violations(p)]
    assert not bad, bad


def core_graph(sources: dict[Path, str] | None = None) -> tuple[dict[str, set[str]], list[str]]:
    """The core's import graph from source: ({module: the core modules it imports at module level},
    ["<module>: <import>" for each import of a core module made inside a function]). ``sources``
    replaces files' text (for the planted cases). The package ``helpers`` itself (its re-exports)
    is not a node; ``helpers.tune`` is, so a tune module importing its own package is a circle."""
    sources = sources or {}
    graph, late = {}, []
    for path in CORE:
        me = module_name(path)
        text = sources.get(path, path.read_text())
        deps = set()
        tree = ast.parse(text)
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            mods = [m for m, _ in imports(path, ast.unparse(node))[0] if m.startswith("helpers.")]
            if not mods:
                continue
            if id(node) not in top:
                late.append(f"{me}: {ast.unparse(node)}")
            deps |= set(mods)
        if me != "helpers":
            graph[me] = deps - {me}
    return graph, late


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle of ``graph`` found by a depth-first walk, each as the modules in order."""
    found, state = [], {}

    def walk(m: str, path: list[str]) -> None:
        state[m] = "open"
        for d in sorted(graph.get(m, ())):
            if state.get(d) == "open":
                found.append(path[path.index(d):] + [d])
            elif d not in state:
                walk(d, path + [d])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            walk(m, [m])
    return found


def test_the_core_imports_at_the_top_without_a_circle():
    graph, late = core_graph()
    assert not late, late
    assert not circles(graph), circles(graph)
    # the layers: the record knows nothing of launching, checking or timing; the reference runs nothing
    assert graph["helpers.variants"] <= {"helpers.gpu", "helpers.epilogue", "helpers.problem"}, graph

    assert graph["helpers.reference"] <= {"helpers.epilogue", "helpers.problem"}, graph["helpers.reference"]
    assert "helpers.check" not in graph["helpers.launch"] and "helpers.bench" not in graph["helpers.check"]


@pytest.mark.parametrize("plant, kind", [
    ("from .check import check\n", "circle"),  # launch -> check -> launch
    ("def f():\n    from .check import check\n", "late"),
    ("import helpers.bench\n", "circle"),
])
def test_the_import_graph_check_catches_a_planted_circle_or_late_import(plant, kind):
    path = ROOT / "helpers" / "launch.py"
    graph, late = core_graph({path: path.read_text() + plant})
    assert (circles(graph) if kind == "circle" else late), plant


CORE_PLANTS = [
    "from days.day09_igemm_simt import Tile\n",
    "import days.kit\n",
    "x = __import__('days.day09_igemm_simt')\n",
    "import sys\nm = sys.modules['days.day09_igemm_simt']\n",
    "import importlib\nm = importlib.import_module('days.day09_igemm_simt')\n",
]
DAY_PLANTS = [  # each a way for day 10 to reach what it may not
    "from .day09_igemm_simt import _entry\n",
    "from days.day12_igemm_pipelined import choose\n",  # a later day
    "from days import day12_igemm_pipelined\n",
    "from . import day12_igemm_pipelined\n",
    "from days import day09_igemm_simt\nf = day09_igemm_simt._entry\n",
    "import days.day09_igemm_simt as d\nf = d._entry\n",
    "import days.day11_igemm_mma\nf = days.day11_igemm_mma._mma_entry\n",
    "import importlib\nf = getattr(importlib.import_module('days.day09_igemm_simt'), '_entry')\n",
    "m = __import__('days.day12_igemm_pipelined')\n",
    "from helpers.variants import _validate\n",
    "from helpers import variants\nf = variants._validate\n",
    "import helpers.variants as hv\nf = hv._validate\n",
]


@pytest.mark.parametrize("source", CORE_PLANTS)
def test_the_core_check_catches_a_planted_violation(source):
    assert core_violations(ROOT / "helpers" / "bench.py", source), source


@pytest.mark.parametrize("source", DAY_PLANTS)
def test_the_day_check_catches_a_planted_violation(source):
    assert day_violations(ROOT / "days" / "day10_igemm_wmma.py", source), source


def test_the_import_checks_let_allowed_imports_pass():
    d10 = ROOT / "days" / "day10_igemm_wmma.py"
    allowed = ("from .day09_igemm_simt import Tile\nfrom .kit import cdiv\n"
               "import days.day09_igemm_simt as d\nt = d.Tile\n")
    assert not day_violations(d10, allowed)
    assert not day_violations(d10, "from helpers import variants\nv = variants.Variant\nd = x.__dict__\n")
    d13 = ROOT / "days" / "day13_igemm_production" / "rule.py"
    assert not day_violations(d13, "from .tiles import TileDescription\nfrom ..kit import cdiv\nfrom . import tiles\n")
    assert day_violations(d13, "from ..day11_igemm_mma import _mma_entry\n")
    assert day_violations(d13, "from .. import day11_igemm_mma\nf = day11_igemm_mma._mma_entry\n")


class _Normalize(ast.NodeTransformer):
    """A function's body with its parameters renamed by position and annotations dropped, so
    that the same helper under other parameter names or without type hints compares equal."""

    def __init__(self, params: list[str]):
        self.names = {p: f"_arg{i}" for i, p in enumerate(params)}

    def visit_Name(self, node: ast.Name) -> ast.Name:  # noqa: N802 - ast.NodeTransformer's naming
        return ast.copy_location(ast.Name(id=self.names.get(node.id, node.id), ctx=node.ctx), node)

    def visit_arg(self, node: ast.arg) -> ast.arg:
        return ast.copy_location(ast.arg(arg=self.names.get(node.arg, node.arg), annotation=None), node)


def _normalized(node: ast.FunctionDef | ast.Lambda) -> str:
    args = node.args
    params = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    if isinstance(node, ast.Lambda):
        body = [ast.Return(node.body)]
    else:
        body = node.body[1:] if ast.get_docstring(node) else node.body
    tree = ast.Module(body=body, type_ignores=[])
    norm = _Normalize(params)
    return ast.dump(norm.visit(tree)) + ast.dump(norm.visit(ast.arguments(
        posonlyargs=[], args=[ast.arg(arg=p) for p in params], kwonlyargs=[], kw_defaults=[], defaults=args.defaults)))


def top_level_functions(path: Path, source: str | None = None) -> dict[str, str]:
    """{name: normalized body} of a file's top-level functions and lambdas bound to a name
    (docstring, own name, parameter names and annotations left out)."""
    out = {}
    for node in ast.parse(source if source is not None else path.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = _normalized(node)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Lambda):
            if isinstance(node.targets[0], ast.Name):
                out[node.targets[0].id] = _normalized(node.value)
    return out


def duplicated_helpers(files: dict[str, dict[str, str]]) -> list[str]:
    seen: dict[str, str] = {}
    dups = []
    for where, funcs in files.items():
        for name, body in funcs.items():
            if body in seen and not seen[body].startswith(where + ":"):
                dups.append(f"{where}:{name} repeats {seen[body]}")
            seen.setdefault(body, f"{where}:{name}")
    return dups


def test_no_helper_is_defined_twice_across_days():
    files = {module_name(p): top_level_functions(p) for p in DAY_FILES}
    dups = duplicated_helpers(files)
    assert not dups, dups
    kit_names = set(top_level_functions(ROOT / "days" / "kit.py"))
    redefined = [f"{m}:{n}" for m, fs in files.items() if m != "days.kit" for n in fs if n in kit_names]
    assert not redefined, f"kit functions redefined in a day: {redefined}"


@pytest.mark.parametrize(
    "copy",
    ["def ceil_div(a: int, b: int) -> int:\n    return -(-a // b)\n",  # the same under another name
     "def ceil_div(x, y):\n    return -(-x // y)\n",  # other parameter names, no annotations
     "ceil_div = lambda n, d: -(-n // d)\n"],  # a lambda
)
def test_the_duplicate_check_catches_a_planted_copy(copy):
    files = {"days.kit": top_level_functions(ROOT / "days" / "kit.py"),
             "days.day99": top_level_functions(Path("x"), copy)}
    assert duplicated_helpers(files) == ["days.day99:ceil_div repeats days.kit:cdiv"]


def test_every_day_module_is_imported_by_the_package():
    on_disk = {p.stem for p in (ROOT / "days").glob("day*.py")} | {p.name for p in (ROOT / "days").glob("day*/")}
    assert set(days.DAY_MODULES) == on_disk
    # day 15 tunes day 13's variants; day 17 runs day 16's; day 19 is wgrad on Hopper; days 20-21 Winograd; 22 split-K
    assert {v.day for v in __import__("helpers").all_variants()} == set(range(1, 15)) | {16, 18, 19, 20, 21, 22}


# ---- the kit -------------------------------------------------------------------------------------

P = Conv2dProblem(N=2, C=6, H=9, W=7, K=5, R=3, S=2, stride=(2, 1), padding=(1, 0), dilation=(1, 2))


def test_pack_by_name():
    args = kit.pack(P, f"x w y {kit.FULL_SIZES} groups cin extra", extra=np.float32(0.5))
    assert args[:3] == (Buffer("x"), Buffer("w"), Buffer("y"))
    assert [int(a) for a in args[3:19]] == [2, 6, 9, 7, 5, 3, 2, P.P, P.Q, 2, 1, 1, 0, 1, 2, 1]
    assert all(type(a) is np.int32 for a in args[3:19])
    assert args[19] == Buffer("cin") and args[20] == np.float32(0.5) and type(args[20]) is np.float32
    with pytest.raises(ValueError, match="'stride' is not a tensor"):
        kit.pack(P, "x stride")
    with pytest.raises(ValueError, match=r"values \['unused'\] are not in the argument list"):
        kit.pack(P, "x w y", unused=np.int32(1))


def test_single_kernel_launches():
    cfg = LaunchConfig((3, 1, 1), (32, 1, 1))
    fn = kit.single_kernel(lambda p: f"k_{p.K}", lambda p: cfg, "x w y K")
    (k,) = fn(P, PLAIN)
    assert (k.name, k.entry, k.config, k.args[3]) == ("main", "k_5", cfg, np.int32(5))


def test_gemm_writes_and_swizzled_tile_visits():
    # 5 x 7 output in 2 x 4 tiles: 3 x 2 tiles; grid (6, 1): swizzle 1 maps bx -> (bx >> 1, bx & 1)
    v = kit.tile_visits((6, 1, 1), 3, 2, swizzle=1)
    assert v.tolist() == [[1, 1], [1, 1], [1, 1]]
    assert (kit.gemm_writes(5, 7, 2, 4, v) == 1).all()
    v0 = kit.tile_visits((6, 1, 1), 3, 2, swizzle=0)  # unswizzled, the same grid covers column 0 only
    assert v0.tolist() == [[1, 0], [1, 0], [1, 0]]
    w = kit.gemm_writes(5, 7, 2, 4, v0).reshape(5, 7)
    assert (w[:, :4] == 1).all() and (w[:, 4:] == 0).all()
    hits = kit.gemm_writes(2, 4, 2, 4, np.ones((1, 1)), row_hits=[1, 2], col_hits=[0, 1, 1, 3])
    assert hits.reshape(2, 4).tolist() == [[0, 1, 1, 3], [0, 2, 2, 6]]


def test_chunks16_and_alignment():
    assert kit.chunks16(8, P) and not kit.chunks16(6, P)  # fp32: 4 per chunk
    half = dataclasses.replace(P, dtype="fp16", name="")
    assert kit.chunks16(8, half) and not kit.chunks16(4, half)  # fp16: 8 per chunk
    t = torch.zeros(9)
    assert kit.alignment_reason({"x": t, "y": None}, {"x": 16, "y": 16}, "why") is None
    reason = kit.alignment_reason({"x": t[1:]}, {"x": 16}, "the loads")
    assert "x.data_ptr() is not 16-byte aligned" in reason and "the loads need it" in reason


# ---- build targets -------------------------------------------------------------------------------


def hopper_only(v: Variant) -> Variant:
    return dataclasses.replace(v, name="hopper_only", min_cc=(9, 0), arch_suffix="a", min_cc_why="wgmma")


def test_build_targets():
    v = get("naive")
    assert v.build_reason((7, 5)) is None and v.target((12, 0)) == "sm_120"
    tc = get("igemm_pipelined")
    assert "8.0 or newer (cp.async" in tc.build_reason((7, 5)) and tc.build_reason((9, 0)) is None
    h = hopper_only(v)
    assert h.target((9, 0)) == "sm_90a" and h.build_reason((9, 0)) is None
    assert "9.0 or newer (wgmma)" in h.build_reason((8, 9))
    assert "exist only on compute capability 9.0" in h.build_reason((12, 0))
    p = Conv2dProblem(N=1, C=3, H=8, W=8, K=4, R=3, S=3, padding=1)
    assert h.supports(p) is None and "hopper_only" in h.supports(p, cc=(12, 0))


# ---- kernel files: a day's .cu includes headers, never another day's .cu -------------------------

KERNEL_DIR = ROOT / "kernels" / "conv2d"
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def included_kernel_files(text: str) -> list[str]:
    """The ``.cu`` files a kernel source includes by name (a kernel two days use lives in a
    header, or each launch is built from its own file: `KernelLaunch.cu_file`)."""
    return [f for f in INCLUDE.findall(text) if f.endswith(".cu")]


def test_no_kernel_file_includes_another_days_kernel_file():
    found = {p.name: included_kernel_files(p.read_text()) for p in sorted(KERNEL_DIR.glob("*.cu*"))}
    assert found and not {k: v for k, v in found.items() if v}


def test_the_include_check_catches_a_planted_cu_include():
    assert included_kernel_files('#include "conv2d_common.cuh"\n#include "16_igemm_wgmma.cu"  // all of it\n') == [
        "16_igemm_wgmma.cu"]
    assert included_kernel_files("#include <cuda_fp16.h>\n// #include is not a .cu\n") == []


def test_a_launch_names_its_own_kernel_file_or_takes_the_variants():
    v = get("naive")
    k = KernelLaunch("main", "e", LaunchConfig((1, 1, 1), (32, 1, 1)), ())
    assert k.cu_file is None and k.source(v) == v.cu_file == "01_naive.cu"
    assert dataclasses.replace(k, cu_file="02_z_out.cu").source(v) == "02_z_out.cu"


# ---- bind: named buffers become pointers ---------------------------------------------------------


def test_bind_resolves_buffers_by_name_and_passes_none_as_null():
    calls = []
    cfg = LaunchConfig((2, 1, 1), (64, 1, 1), 128)
    k1 = KernelLaunch("first", "e1", cfg, (Buffer("x"), Buffer("workspace"), np.int32(7)))
    k2 = KernelLaunch("second", "e2", cfg, (Buffer("workspace"), Buffer("cin"), Buffer("y")))
    x, ws, y = torch.zeros(4), torch.zeros(8, dtype=torch.uint8), torch.zeros(2)
    compiled = [Launcher(k1, RecordingKernel("e1", calls)), Launcher(k2, RecordingKernel("e2", calls))]
    kernels = bind(compiled, {"x": x, "workspace": ws, "y": y, "cin": None})
    assert list(kernels) == ["first", "second"]
    kernels["second"]()
    kernels["first"]()
    (_, b2, *_), (_, b1, grid, block, shared) = calls
    assert b1 == packed_like_pycuda((np.uintp(x.data_ptr()), np.uintp(ws.data_ptr()), np.int32(7)))
    assert (grid, block, shared) == ((2, 1, 1), (64, 1, 1), 128)
    assert b2 == packed_like_pycuda((np.uintp(ws.data_ptr()), np.uintp(0), np.uintp(y.data_ptr())))
    with pytest.raises(ValueError, match="passes 'bias'"):
        bind([Launcher(KernelLaunch("k", "e", cfg, (Buffer("bias"),)), RecordingKernel("e", calls))], {"x": x})


def test_epilogue_is_plain_by_default():
    assert PLAIN.is_plain and Epilogue() == PLAIN
    assert not Epilogue(relu=True).is_plain and not Epilogue(alpha=2.0).is_plain


def test_pack_refuses_shadowing_and_python_numbers():
    with pytest.raises(ValueError, match=r"values \['x'\] would shadow"):
        kit.pack(P, "x w y", x=np.int32(7))
    with pytest.raises(ValueError, match=r"values \['N'\] would shadow"):
        kit.pack(P, "N", N=np.int32(99))
    with pytest.raises(TypeError, match=r"values \['GM'\] must be numpy scalars"):
        kit.pack(P, "GM", GM=5)


def notebook_private_uses(source: str) -> list[str]:
    """Private (underscore) names of the core or the days that a notebook's code reaches."""
    fake = ROOT / "notebooks" / "cell.py"
    mods, _ = imports(fake, source)
    refs = [(m, n) for m, names in mods for n in names] + attribute_uses(fake, source)
    return [f"{m}.{n}" for m, n in refs if m.split(".")[0] in ("helpers", "days") and _private(n)]


def test_notebooks_use_only_public_names():
    """The notebooks import the harness and the days through their public names only."""
    import json

    bad = []
    for nb_path in sorted((ROOT / "notebooks").glob("day_*.ipynb")):
        cells = [c for c in json.loads(nb_path.read_text())["cells"] if c["cell_type"] == "code"]
        source = "\n".join("".join(c["source"]) for c in cells)
        source = "\n".join(ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!")))
        bad += [f"{nb_path.name}: {u}" for u in notebook_private_uses(source)]
    assert not bad, bad
    assert notebook_private_uses("import days.day13_igemm_production as hp\nhp.tiles._instantiated()\n")
    assert notebook_private_uses("from helpers.variants import _validate\n")


def test_an_installed_copy_imports_every_day(tmp_path):
    """``pip install .`` into a fresh virtual environment (its packages found by setuptools, the
    kernels shipped beside them) gives a copy whose every day registers its variants from the
    installed files, not from this checkout (day 14's package was left out of the hand-made list)."""
    import shutil
    import site
    import subprocess
    import sys
    import venv

    src = tmp_path / "src"  # a copy: a build in the checkout would leave build/lib behind for the next one
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", ".whl", "build", "*.egg-info", "out",
                                                              "__pycache__", "notebooks", "results"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir)
    # torch, pip and setuptools from the environment running the tests: its site-packages after the
    # new one's. (system_site_packages would give the base interpreter's, which inside a venv, as
    # the README's setup runs the tests, lacks them on a stock machine.)
    (site_dir,) = (env_dir / "lib").glob("python3*/site-packages")
    (site_dir / "parent_environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    py = env_dir / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", str(src)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    probe = ("import days, helpers, helpers.compile as hc; from helpers.variants import all_variants; "
             "print(hc.KERNEL_DIR); print(sorted({v.day for v in all_variants()})); print(days.__file__)")
    r = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-2000:]
    kernel_dir, days, days_file = r.stdout.splitlines()
    assert str(env_dir) in kernel_dir and str(env_dir) in days_file and sys.prefix not in days_file
    assert days == str([d for d in range(1, 23) if d not in (15, 17)])  # day 15 tunes, day 17 runs day 16's variant


def test_the_repository_points_at_nothing_outside_itself():
    """No tracked text names a file the repository does not hold: the design document and the seed
    documents the project grew from live beside the checkout, not in it; what a reader needs is here."""
    import subprocess

    outside = re.compile("design" + r"\.md|\.\./" + "shared|shared/" + "seeds")  # split: it must not match itself

    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    found = []
    for f in files:
        if f.endswith((".png", ".csv")) or not (ROOT / f).is_file():
            continue
        text = (ROOT / f).read_text(errors="replace")
        found += [f"{f}: {m}" for m in outside.findall(text)]
    assert found == [], found


def test_no_formatter_markers_where_no_formatter_runs():
    """No formatter runs in CI (ruff lints only), so a formatter's markers are noise: none in the
    Python files or in the notebooks' code cells (printed outputs, which show code as it was run,
    are not searched)."""
    import subprocess

    import nbformat

    marker = re.compile("# fmt" + r": ?(skip|off|on)\b")  # split: it must not match itself
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    found = []
    for f in files:
        path = ROOT / f
        if f.endswith(".py") and path.is_file():
            found += [f for line in path.read_text().splitlines() if marker.search(line)]
        elif f.endswith(".ipynb") and path.is_file():
            cells = nbformat.read(path, as_version=4).cells
            found += [f for c in cells if c.cell_type == "code" and marker.search(c.source)]
    assert found == [], sorted(set(found))
    assert marker.search("x = 1  # fmt" + ": skip")  # the pattern finds a planted marker
