"""Stage the repository's pages into a MkDocs source tree and build the static site.

Nothing is executed: the pages are the committed, executed notebooks (rendered by mkdocs-jupyter
with the outputs they were saved with), the README as the home page, every ``.md`` page under
``notebooks/`` (the glossary), and one highlighted page per kernel source in ``kernels/conv2d``.

Links are rewritten while staging, so that what works on GitHub works on the site:

* ``README.md`` becomes ``index.md``; notebooks, ``.md`` pages and `TOP_PAGES` (``HARNESS.md``,
  ``RESULTS.md``) keep their paths;
* images and CSVs (``.png .jpg .jpeg .svg .gif .csv``) are copied as they are;
* any other file a page links to (a ``.cu``, ``.py``, ``.sh``, ...) gets a page of its own, its
  text in a highlighted code block, at ``<path>.md`` (``kernels/conv2d/01_naive.cu.md``);
* in a Markdown page a link names the staged file (MkDocs turns it into the page's URL and
  checks it); in a notebook, which nbconvert renders, it is written as the final relative URL
  (``../day_01_naive/``);
* a link to a file that does not exist, or to a folder, stops the build with `BuildError` (the
  site would have a broken link).

MkDocs then builds with ``--strict`` (any warning, e.g. a link it cannot resolve, is an error).
The theme is Material with its Google-font download switched off and MathJax served from the
``jupyter-server-mathjax`` package's copy, so a page loads nothing from the internet.

Sources: MkDocs (https://www.mkdocs.org/user-guide/configuration/), Material for MkDocs
(https://squidfunk.github.io/mkdocs-material/setup/), mkdocs-jupyter
(https://github.com/danielfrg/mkdocs-jupyter, its README lists the plugin options).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD_DIR = ROOT / "build" / "site"
# Markdown pages at the repository's top, besides the README: pages of their own, by their titles in the navigation
TOP_PAGES = {"HARNESS.md": "The harness", "RESULTS.md": "Results"}
STAGE_DIR = ROOT / "build" / "site-src"
SITE_NAME = "conv2d-days"
ASSET_SUFFIXES = {".png", ".jpg", ".jpeg", ".svg", ".gif", ".csv"}
LANGUAGES = {".cu": "cuda", ".cuh": "cuda", ".py": "python", ".sh": "bash", ".toml": "toml", ".txt": "text",
             ".yml": "yaml", ".yaml": "yaml", ".json": "json", ".md": "markdown"}
ASSETS_DIR = "assets/conv2d"  # website/assets: the site's own CSS and JavaScript
MATHJAX_DIR = "assets/mathjax"
# jupyter-server-mathjax ships MathJax 2 with this one full configuration (plus Safe). The URL is
# absolute here (mkdocs-jupyter puts it in every notebook page as it is); hooks.py makes it
# relative to each page, so a site served under a sub-path (a project site) finds it too.
MATHJAX_URL = f"/{MATHJAX_DIR}/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe,local/conv2d"
# ... whose HTML-CSS output ships only the STIX-Web fonts: use those and no image fonts. Its
# width probe, a font "MathJax_Blank" at url('about:blank'), is a request Chromium refuses with a
# console error; pointing it at a local() font measures the same without a request.
MATHJAX_LOCAL_CONFIG = """MathJax.Hub.Config({
  "HTML-CSS": {availableFonts: [], preferredFont: null, webFont: "STIX-Web", imageFont: null,
               styles: {"@font-face": {"font-family": "MathJax_Blank", src: "local('MathJax_Blank')"}}}
});
MathJax.Ajax.loadComplete("[MathJax]/config/local/conv2d.js");
"""
# [text](target "title") and ![alt](target); the target has no spaces (the repository's convention)
LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)((?:\s+\"[^\"]*\")?\))")


class BuildError(Exception):
    """The site cannot be built as the pages stand (a broken link, a failed MkDocs build)."""


def day_notebooks() -> list[str]:
    """The day notebooks' repository paths, ``notebooks/day_NN_*.ipynb``, in file-name order."""
    return [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "notebooks").glob("day_*.ipynb"))]


def taught_on(repo_path: str) -> tuple[list[str], list[str]]:
    """(the day notebooks whose kernels are built from ``repo_path``, the other day notebooks that
    name its file), each in order: the "taught on" and "also on" links of its code page."""
    from helpers.variants import all_variants

    name = Path(repo_path).name
    days = {f"{v.day:02d}" for v in all_variants() if v.cu_file == name}
    notebooks = [nb for nb in day_notebooks() if name in (ROOT / nb).read_text()]
    taught = [nb for nb in notebooks if Path(nb).stem.split("_")[1] in days]
    return taught, [nb for nb in notebooks if nb not in taught]


def _code_page(repo_path: str) -> str:
    """A page holding one repository file as a highlighted code block, under a line that links the
    days that teach it and the others that name it (`taught_on`)."""
    path = ROOT / repo_path
    text = path.read_text()
    fence = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", text)), default=0))
    lang = LANGUAGES.get(path.suffix, "text")
    here = posixpath.dirname(repo_path)

    def links(nbs: list[str]) -> str:
        return ", ".join(f"[day {Path(nb).stem.split('_')[1]}]({posixpath.relpath(nb, here)})" for nb in nbs)

    taught, named = taught_on(repo_path)
    line = " ".join(x for x in (f"Taught on {links(taught)}." if taught else "",
                                f"Also on {links(named)}." if named else "") if x)
    head = f"# `{repo_path}`\n\n" + (f"{line}\n\n" if line else "")
    return f'{head}{fence}{lang} linenums="1"\n{text.rstrip()}\n{fence}\n'


def page_url(path: str) -> str:
    """The site URL path (directory URLs, no leading slash) of staged file ``path``: a page
    ``a/b.md`` or ``a/b.ipynb`` is served at ``a/b/``, ``index.md`` at ``""``; other files as they are."""
    if not path.endswith((".md", ".ipynb")):
        return path
    stem = path.rsplit(".", 1)[0]
    if stem == "index" or stem.endswith("/index"):
        return stem[: -len("index")]
    return stem + "/"


class Stager:
    """Copies pages into the stage folder, rewriting their links; records the pages linked to."""

    def __init__(self, stage: Path):
        self.stage = stage
        self.code_pages: set[str] = set()

    def target(self, source: str, link: str) -> str:
        """The staged link for ``link`` found in repository file ``source``."""
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", link, flags=re.I):  # scheme, same-page anchor, absolute
            return link
        path, _, frag = link.partition("#")
        resolved = (ROOT / source).parent.joinpath(path).resolve()
        try:
            rel = resolved.relative_to(ROOT).as_posix()
        except ValueError:
            raise BuildError(f"{source}: the link {link!r} leaves the repository") from None
        if not resolved.exists():
            raise BuildError(f"{source}: the link {link!r} points to {rel}, which does not exist")
        if resolved.is_dir():
            raise BuildError(f"{source}: the link {link!r} points to the folder {rel}; link a file")
        if rel == "README.md":
            mapped = "index.md"
        elif rel in TOP_PAGES or resolved.suffix in (".ipynb", ".md") and rel.startswith("notebooks/"):
            mapped = rel
        elif resolved.suffix.lower() in ASSET_SUFFIXES:
            mapped = rel
            dest = self.stage / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(resolved, dest)
        else:
            mapped = rel + ".md"
            self.code_pages.add(rel)
        staged_source = "index.md" if source == "README.md" else source
        if source.endswith(".ipynb"):  # nbconvert renders it: MkDocs resolves none of its links
            page = mapped.endswith((".md", ".ipynb"))
            new = posixpath.relpath(page_url(mapped) or ".", page_url(staged_source) or ".") + ("/" if page else "")
        else:  # a Markdown page: MkDocs turns links to .md/.ipynb files into page URLs and checks them
            new = os.path.relpath(self.stage / mapped, (self.stage / staged_source).parent).replace(os.sep, "/")
        return new + (f"#{frag}" if frag else "")

    def rewrite(self, source: str, markdown: str) -> str:
        return LINK.sub(lambda m: m.group(1) + self.target(source, m.group(2)) + m.group(3), markdown)

    def page(self, source: str, dest: str | None = None) -> None:
        """Stage a Markdown page (``dest`` defaults to its own path)."""
        text = self.rewrite(source, (ROOT / source).read_text())
        out = self.stage / (dest or source)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)

    def notebook(self, source: str) -> None:
        """Stage a notebook with its markdown cells' links rewritten; code cells and outputs untouched."""
        nb = json.loads((ROOT / source).read_text())
        for cell in nb["cells"]:
            if cell["cell_type"] == "markdown":
                cell["source"] = self.rewrite(source, "".join(cell["source"]))
        out = self.stage / source
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(nb, indent=1, ensure_ascii=False))


def _mathjax_static() -> Path:
    import jupyter_server_mathjax

    return Path(jupyter_server_mathjax.__file__).parent / "static"


def repository_url() -> str | None:
    """The URL the site's navigation links to as the repository: ``$CONV2D_DAYS_REPO_URL`` if set (empty:
    no link), else the checkout's ``origin`` remote when it is a web URL (``https://...``; an
    ``git@host:owner/name`` address is turned into ``https://host/owner/name``), else None (no link).
    """
    url = os.environ.get("CONV2D_DAYS_REPO_URL")
    if url is None:
        r = subprocess.run(["git", "-C", str(ROOT), "remote", "get-url", "origin"], capture_output=True, text=True)
        url = r.stdout.strip() if r.returncode == 0 else ""
        m = re.fullmatch(r"git@([^:]+):(.+?)(\.git)?", url)
        if m:
            url = f"https://{m[1]}/{m[2]}"
        url = url.removesuffix(".git")
    return url if url.startswith(("https://", "http://")) else None


def stage(stage_dir: Path = STAGE_DIR, repo_url: str | None = None) -> dict:
    """Write the MkDocs source tree into ``stage_dir`` (emptied first); return the MkDocs config.

    ``repo_url``, when given, is the navigation's last entry, "Repository" (a plain link: MkDocs'
    ``repo_url`` would make Material fetch the repository's star count from GitHub's API on
    every page, and the site loads nothing from the internet).

    Raises:
        BuildError: a page links to a file that does not exist, to a folder, or out of the repository.
    """
    if stage_dir.exists():
        shutil.rmtree(stage_dir)
    docs = stage_dir / "docs"
    docs.mkdir(parents=True)
    st = Stager(docs)
    st.page("README.md", "index.md")
    for p in TOP_PAGES:
        st.page(p)
    pages = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "notebooks").glob("*.md"))
    for p in pages:
        st.page(p)
    days = day_notebooks()
    for d in days:
        st.notebook(d)
    kernels = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "kernels" / "conv2d").iterdir() if p.is_file())
    st.code_pages.update(kernels)
    for rel in sorted(st.code_pages):
        out = docs / (rel + ".md")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(_code_page(rel))
    shutil.copytree(Path(__file__).with_name("assets"), docs / ASSETS_DIR)
    shutil.copytree(_mathjax_static(), docs / MATHJAX_DIR)
    (docs / MATHJAX_DIR / "config" / "local").mkdir(parents=True, exist_ok=True)
    (docs / MATHJAX_DIR / "config" / "local" / "conv2d.js").write_text(MATHJAX_LOCAL_CONFIG)

    # Pages and days without a title: MkDocs (and mkdocs-jupyter, for a notebook) take the page's heading
    nav = [{"Home": "index.md"}, *pages, {"Days": days}, *({title: p} for p, title in TOP_PAGES.items())]
    nav.append({"Kernels": [{Path(k).name: k + ".md"} for k in kernels]})
    others = sorted(st.code_pages - set(kernels))
    if others:
        nav.append({"Other sources": [{o: o + ".md"} for o in others]})
    if repo_url:
        nav.append({"Repository": repo_url})
    config = {
        "site_name": SITE_NAME,
        "site_description": "Hand-written CUDA conv2d kernels, day by day, checked against float64 and timed "
        "against cuDNN",
        "docs_dir": "docs",
        "hooks": [str(Path(__file__).with_name("hooks.py"))],
        "use_directory_urls": True,
        "nav": nav,
        "theme": {
            "name": "material",
            "font": False,
            "features": ["navigation.footer", "navigation.sections", "search.highlight", "content.code.copy",
                         "toc.integrate"],
        },
        "extra_css": [f"{ASSETS_DIR}/site.css"],
        "extra_javascript": [f"{ASSETS_DIR}/site.js"],
        "plugins": [
            "search",
            {
                "mkdocs-jupyter": {
                    "include": ["*.ipynb"],
                    "execute": False,
                    "include_source": True,
                    "allow_errors": False,
                    "custom_mathjax_url": MATHJAX_URL,
                    "cache": False,
                }
            },
        ],
        "markdown_extensions": [
            "tables",
            "admonition",
            {"toc": {"permalink": True}},
            {"pymdownx.highlight": {"anchor_linenums": True}},
            "pymdownx.superfences",
        ],
        "validation": {"links": {"not_found": "warn", "absolute_links": "info", "unrecognized_links": "warn"}},
    }
    (stage_dir / "mkdocs.yml").write_text(json.dumps(config, indent=1, ensure_ascii=False))  # JSON is YAML
    return config


def build(out: Path = BUILD_DIR, stage_dir: Path = STAGE_DIR, repo_url: str | None = None) -> Path:
    """Stage the pages and run ``mkdocs build --strict`` into ``out``; return ``out``.

    ``repo_url``: the repository the navigation links to (`stage`); None: `repository_url()`.

    Raises:
        BuildError: a broken link while staging, or MkDocs failed (its output is in the message).
    """
    stage(stage_dir, repo_url if repo_url is not None else repository_url())
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean", "-f", str(stage_dir / "mkdocs.yml"),
         "-d", str(out.resolve())],
        capture_output=True, text=True,
    )
    if r.returncode != 0:
        raise BuildError(f"mkdocs build failed (exit {r.returncode}):\n{r.stdout}{r.stderr}")
    return out
