"""Open a built site in headless Chromium: every page, its console, its images and its links.

`audit` serves the site folder on localhost and visits every HTML page with Playwright driving
the system's Chromium (Debian's ``chromium`` package: Playwright's own browser download needs
the internet). Per page it records console errors, uncaught page errors, requests that failed
or answered 400 and above, and images that did not load (``naturalWidth == 0``); it collects
the page's internal links and, once every page is visited, checks that each link's page exists
in the site and, for a ``#fragment``, that the page has an element with that id. On the home
page it also runs a search and expects results.

`write_screenshots` writes the PNGs the README shows (the home page and one day).

Sources: Playwright for Python (https://playwright.dev/python/docs/api/class-page: ``on("console")``,
``on("pageerror")``, ``on("requestfailed")``, ``on("response")``); Chromium's command-line flags
(``--headless``, ``--no-sandbox``; the background-networking ones keep it from calling out).
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import re
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOT_DIR = ROOT / "website" / "screenshots"
SCREENSHOT_DAY = "notebooks/day_09_igemm_simt/"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
                 "--disable-background-networking", "--disable-component-update"]
SEARCH_TERM = "swizzle"
# Resolves once MathJax (on notebook pages) has typeset the page, and at once where there is none
MATHJAX_DONE = "() => new Promise(r => (window.MathJax && MathJax.Hub) ? MathJax.Hub.Queue(() => r(true)) : r(false))"


def chromium_path() -> str | None:
    """The Chromium to drive: ``$CHROMIUM`` if set, else ``chromium`` or ``chromium-browser`` on PATH."""
    return os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class PageReport:
    """What one page did in the browser. ``problems`` is empty for a clean page."""

    url: str
    problems: list[str] = field(default_factory=list)
    images: int = 0  # <img> elements that loaded
    links: set[str] = field(default_factory=set)  # internal link targets, absolute URLs


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # no request log on stderr
        pass


class _PrefixHandler(_QuietHandler):
    """Serves the folder under the URL path ``prefix`` (e.g. ``/conv2d-days/``, as a project site
    is served); anything outside it answers 404."""

    prefix = "/"

    def translate_path(self, path: str) -> str:
        if not path.startswith(self.prefix):
            return os.path.join(self.directory, "\0outside-the-prefix")  # no such file: 404
        return super().translate_path("/" + path[len(self.prefix) :])


@contextlib.contextmanager
def serve(site: Path, prefix: str = "/"):
    """Serve folder ``site`` on 127.0.0.1 (a free port) in a thread under the URL path ``prefix``;
    yield its base URL."""
    handler = functools.partial(type("Handler", (_PrefixHandler,), {"prefix": prefix}), directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}{prefix}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def browser():
    """A headless system Chromium under Playwright.

    Raises:
        FileNotFoundError: no Chromium found (install Debian's ``chromium`` or set ``$CHROMIUM``).
    """
    from playwright.sync_api import sync_playwright

    exe = chromium_path()
    if exe is None:
        raise FileNotFoundError("no Chromium: install Debian's chromium package or set $CHROMIUM")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def page_urls(site: Path, base: str) -> list[str]:
    """The URL of every HTML page in the built ``site`` folder (``index.html`` as its folder)."""
    urls = []
    for p in sorted(site.rglob("*.html")):
        rel = p.relative_to(site).as_posix()
        urls.append(base + (rel[: -len("index.html")] if rel.endswith("index.html") else rel))
    return urls


def _file_for(site: Path, base: str, url: str) -> Path | None:
    """The file in ``site`` that serves ``url`` (a folder's ``index.html``), or None."""
    path = unquote(urlsplit(url).path)[len(urlsplit(base).path) :]
    f = site / path
    if f.is_dir():
        f = f / "index.html"
    return f if f.is_file() else None


def visit(page, url: str, base: str) -> PageReport:
    """Load ``url`` in Playwright ``page`` and report its problems, loaded images and internal links."""
    rep = PageReport(url)
    on_console = lambda m: m.type == "error" and rep.problems.append(f"console error: {m.text}")  # noqa: E731
    on_error = lambda e: rep.problems.append(f"page error: {e}")  # noqa: E731
    on_failed = lambda r: rep.problems.append(f"request failed: {r.url} ({r.failure})")  # noqa: E731
    on_response = lambda r: r.status >= 400 and rep.problems.append(f"HTTP {r.status}: {r.url}")  # noqa: E731
    page.on("console", on_console)
    page.on("pageerror", on_error)
    page.on("requestfailed", on_failed)
    page.on("response", on_response)
    try:
        page.goto(url, wait_until="load")
        page.evaluate(MATHJAX_DONE)
        page.wait_for_load_state("networkidle")
        imgs = page.eval_on_selector_all("img", "els => els.map(e => [e.currentSrc.slice(0, 80), e.complete && "
                                         "e.naturalWidth > 0])")
        for src, ok in imgs:
            if not ok:
                rep.problems.append(f"image did not load: {src}")
        rep.images = sum(ok for _, ok in imgs)
        hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))")
        for h in hrefs:
            if re.match(r"^[a-z][a-z0-9+.-]*:", h, flags=re.I) and not h.startswith(base):
                continue  # mailto:, https://elsewhere: not this site's
            rep.links.add(urljoin(url, h))
    finally:
        page.remove_listener("console", on_console)
        page.remove_listener("pageerror", on_error)
        page.remove_listener("requestfailed", on_failed)
        page.remove_listener("response", on_response)
    return rep


def check_links(site: Path, base: str, reports: list[PageReport]) -> list[str]:
    """Broken internal links over all reports: a missing page, or a ``#fragment`` with no such id."""
    ids: dict[Path, set[str]] = {}
    broken = []
    for rep in reports:
        for link in sorted(rep.links):
            target = _file_for(site, base, link.split("#")[0])
            if target is None:
                broken.append(f"{rep.url}: link to a missing page: {link}")
                continue
            frag = unquote(urlsplit(link).fragment)
            if not frag or target.suffix != ".html":
                continue
            if target not in ids:
                ids[target] = set(re.findall(r"""\bid=["']([^"']+)["']""", target.read_text(errors="replace")))
            if frag not in ids[target]:
                broken.append(f"{rep.url}: link to a missing anchor: {link}")
    return broken


def search_results(page, base: str, term: str = SEARCH_TERM) -> int:
    """Type ``term`` into the site's search box on the home page; the number of results shown."""
    page.goto(base, wait_until="load")
    page.fill("input.md-search__input", term)  # visible in the header at desktop widths
    page.wait_for_selector(".md-search-result__item", timeout=15_000)
    return page.locator(".md-search-result__item").count()


def audit(site: Path, prefix: str = "/") -> tuple[list[PageReport], list[str]]:
    """Visit every page of the built ``site``, served under the URL path ``prefix``; return the
    per-page reports and the site-wide problems (broken internal links; a search that finds
    nothing). Clean: every report's ``problems`` and the second list are empty. Under a prefix
    other than "/", a URL written from the site's root (``/assets/...``) is a failed request."""
    with serve(site, prefix) as base, browser() as b:
        page = b.new_page()
        reports = [visit(page, url, base) for url in page_urls(site, base)]
        problems = check_links(site, base, reports)
        try:
            if search_results(page, base) == 0:
                problems.append(f"search for {SEARCH_TERM!r} found nothing")
        except Exception as e:  # noqa: BLE001 - a timeout or a missing search box is the finding
            problems.append(f"search for {SEARCH_TERM!r} failed: {type(e).__name__}: {e}")
    return reports, problems


LAYOUT_JS = """() => {
  const kernel = [...document.querySelectorAll(".jp-RenderedMarkdown pre")]
    .find(p => p.textContent.includes("__global__"));
  const style = kernel ? getComputedStyle(kernel) : null;
  const figures = [...document.querySelectorAll(".jp-OutputArea-output img")].filter(i => i.naturalWidth > 0);
  const widest = figures.reduce((a, i) => (i.naturalWidth > (a ? a.naturalWidth : 0) ? i : a), null);
  return {
    content_px: document.querySelector(".md-content").getBoundingClientRect().width,
    kernel_white_space: style && style.whiteSpace, kernel_word_break: style && style.wordBreak,
    kernel_font_px: style && parseFloat(style.fontSize),
    figure_natural_px: widest && widest.naturalWidth,
    figure_shown_px: widest && widest.getBoundingClientRect().width,
    plot_cells: figures.length && [...document.querySelectorAll(".jp-CodeCell")]
      .filter(c => c.querySelector(".jp-OutputArea-output img")).length,
    plot_code_folded: document.querySelectorAll("details.c2d-plot-code:not([open])").length,
  };
}"""


def layout(site: Path, page_path: str, viewport: tuple[int, int] = (1280, 800)) -> dict:
    """How page ``page_path`` of the built site lays out in Chromium at ``viewport``: the content
    column's width (``content_px``), the first kernel source shown in a notebook output (its CSS
    ``white-space``, ``word-break`` and font size in px), the widest figure's natural and rendered
    width, the code cells with a figure (``plot_cells``) and the plotting code folded under them
    (``plot_code_folded``), and ``lightbox_px``: that figure's width once clicked (the site's
    lightbox), or 0."""
    with serve(site) as base, browser() as b:
        page = b.new_page(viewport={"width": viewport[0], "height": viewport[1]})
        page.goto(base + page_path, wait_until="networkidle")
        out = page.evaluate(LAYOUT_JS)
        out["lightbox_px"] = 0
        if out["figure_natural_px"]:
            figures = page.locator(".jp-OutputArea-output img")
            widest = max(range(figures.count()), key=lambda i: figures.nth(i).evaluate("e => e.naturalWidth"))
            figures.nth(widest).click()
            box = page.locator(".c2d-lightbox img")
            if box.count():
                out["lightbox_px"] = box.first.evaluate("e => e.getBoundingClientRect().width")
        return out


def write_screenshots(site: Path, out: Path = SCREENSHOT_DIR) -> list[Path]:
    """Screenshots of the home page and of ``SCREENSHOT_DAY`` (1280 x 800, the top of each page)."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with serve(site) as base, browser() as b:
        page = b.new_page(viewport={"width": 1280, "height": 800})
        for name, rel in (("home.png", ""), ("day.png", SCREENSHOT_DAY)):
            page.goto(base + rel, wait_until="networkidle")
            page.screenshot(path=str(out / name))
            written.append(out / name)
    return written
