"""The shape of the code: the harness core knows no day, days share the kit, one launch path.

* imports, parsed from every module's source: no core module (``helpers/``) imports the days
  package; a day imports the core, the kit and earlier days only, and no other day's private
  (underscore) name; the core loads the days only through `helpers.variants.DAYS_PACKAGE`;
* no helper is defined twice across the day modules (same body under any name), and no day
  redefines a kit name;
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

import days
from days import kit
from helpers.epilogue import PLAIN, Epilogue
from helpers.problem import Conv2dProblem
from helpers.variants import DAYS_PACKAGE, Buffer, KernelLaunch, LaunchConfig, Variant, bind, get

ROOT = Path(__file__).resolve().parents[1]
CORE = sorted((ROOT / "helpers").glob("*.py"))
DAY_FILES = sorted(p for p in (ROOT / "days").rglob("*.py") if p.name != "__init__.py" or p.parent.name != "days")


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports(path: Path, source: str | None = None) -> list[tuple[str, list[str]]]:
    """[(absolute module imported, [names taken from it])] of one file (relative imports resolved)."""
    tree = ast.parse(source if source is not None else path.read_text())
    pkg = module_name(path).split(".")
    if path.name != "__init__.py":
        pkg = pkg[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = pkg[: len(pkg) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            names = [a.name for a in node.names]
            if node.module is None:  # `from . import x`: x are modules
                out += [(f"{mod}.{n}", []) for n in names]
            else:
                out.append((mod, names))
    return out


def day_of(module: str) -> int | None:
    """The day number of a days.dayNN_* module (or a module inside a day package), else None."""
    m = re.match(r"days\.day(\d\d)_", module)
    return int(m.group(1)) if m else None


def core_violations(path: Path, source: str | None = None) -> list[str]:
    return [f"{path.name} imports {mod}" for mod, _ in imports(path, source) if mod.split(".")[0] == DAYS_PACKAGE]


def day_violations(path: Path, source: str | None = None) -> list[str]:
    me = module_name(path)
    my_day = day_of(me)
    bad = []
    for mod, names in imports(path, source):
        top = mod.split(".")[0]
        if top not in ("helpers", "days") and mod not in ("__future__",):
            continue
        other = day_of(mod)
        if top == "days" and other is not None and other != my_day:
            if my_day is not None and other > my_day:
                bad.append(f"{me} imports a later day, {mod}")
            bad += [f"{me} imports the private {mod}.{n}" for n in names if n.startswith("_")]
        if top == "helpers" and any(n.startswith("_") for n in names):
            bad += [f"{me} imports the core's private {mod}.{n}" for n in names if n.startswith("_")]
    return bad


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


def test_the_import_checks_catch_planted_violations():
    core = ROOT / "helpers" / "bench.py"
    assert core_violations(core, "from days.day09_igemm_simt import Tile\n")
    assert core_violations(core, "import days.kit\n")
    d10 = ROOT / "days" / "day10_igemm_wmma.py"
    assert day_violations(d10, "from .day09_igemm_simt import _entry\n")
    assert day_violations(d10, "from days.day12_igemm_pipelined import choose\n")  # a later day
    assert day_violations(d10, "from helpers.variants import _validate\n")
    assert not day_violations(d10, "from .day09_igemm_simt import Tile\nfrom .kit import cdiv\n")
    d12 = ROOT / "days" / "day12_igemm_pipelined" / "rule.py"
    assert not day_violations(d12, "from .tiles import TileDescription\nfrom ..kit import cdiv\n")  # its own package
    assert day_violations(d12, "from ..day11_igemm_mma import _mma_entry\n")


def top_level_functions(path: Path, source: str | None = None) -> dict[str, str]:
    """{name: normalized body} of a file's top-level functions (docstring and own name left out)."""
    out = {}
    for node in ast.parse(source if source is not None else path.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            body = node.body[1:] if ast.get_docstring(node) else node.body
            out[node.name] = ast.dump(ast.Module(body=body, type_ignores=[])) + ast.dump(node.args)
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


def test_the_duplicate_check_catches_a_planted_copy():
    copy = "def ceil_div(a: int, b: int) -> int:\n    return -(-a // b)\n"
    files = {"days.kit": top_level_functions(ROOT / "days" / "kit.py"),
             "days.day99": top_level_functions(Path("x"), copy)}  # fmt: skip
    assert duplicated_helpers(files) == ["days.day99:ceil_div repeats days.kit:cdiv"]


def test_every_day_module_is_imported_by_the_package():
    on_disk = {p.stem for p in (ROOT / "days").glob("day*.py")} | {p.name for p in (ROOT / "days").glob("day*/")}
    assert set(days.DAY_MODULES) == on_disk
    assert {v.day for v in __import__("helpers").all_variants()} == set(range(1, 13))


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


# ---- bind: named buffers become pointers ---------------------------------------------------------


def test_bind_resolves_buffers_by_name_and_passes_none_as_null():
    calls = []

    def fake_kernel(*args, grid, block, shared):
        calls.append((args, grid, block, shared))

    cfg = LaunchConfig((2, 1, 1), (64, 1, 1), 128)
    k1 = KernelLaunch("first", "e1", cfg, (Buffer("x"), Buffer("workspace"), np.int32(7)))
    k2 = KernelLaunch("second", "e2", cfg, (Buffer("workspace"), Buffer("cin"), Buffer("y")))
    x, ws, y = torch.zeros(4), torch.zeros(8, dtype=torch.uint8), torch.zeros(2)
    kernels = bind([(k1, fake_kernel), (k2, fake_kernel)], {"x": x, "workspace": ws, "y": y, "cin": None})
    assert list(kernels) == ["first", "second"]
    kernels["second"]()
    kernels["first"]()
    (a2, *_), (a1, grid, block, shared) = calls
    assert [int(a) for a in a1] == [x.data_ptr(), ws.data_ptr(), 7]
    assert (grid, block, shared) == ((2, 1, 1), (64, 1, 1), 128)
    assert [int(a) for a in a2] == [ws.data_ptr(), 0, y.data_ptr()]
    with pytest.raises(ValueError, match="passes 'bias'"):
        bind([(KernelLaunch("k", "e", cfg, (Buffer("bias"),)), fake_kernel)], {"x": x})


def test_epilogue_is_plain_by_default():
    assert PLAIN.is_plain and Epilogue() == PLAIN
    assert not Epilogue(relu=True).is_plain and not Epilogue(alpha=2.0).is_plain
