"""MkDocs hooks for the site (named in the staged ``mkdocs.yml``; see `website.build`).

`on_page_content`: on a notebook page, point each table-of-contents entry at the heading id the
rendered notebook really has, with the heading's full text as its title. mkdocs-jupyter takes
the TOC from Python-Markdown, which drops inline code from both the slug and the title
(``### `check()`: correctness…`` → ``#correctness…``, ": correctness…"), while nbconvert gives
the heading the id of its full text (``check-correctness…``). The TOC lists the headings in page
order, so each entry is matched to the next heading whose id contains the entry's words in order.

It also marks a notebook's prompts ("In [3]:") and its copy buttons' "Copied!" notices
``data-search-exclude``, so search results quote the text, not those.

`on_post_page`: the absolute MathJax URL mkdocs-jupyter writes into each notebook page
(``/assets/mathjax/...``) made relative to the page, so the site works under a sub-path.

Source: MkDocs hooks (https://www.mkdocs.org/user-guide/configuration/#hooks) and the
``on_page_content`` and ``on_post_page`` events (https://www.mkdocs.org/dev-guide/plugins/).
"""

from __future__ import annotations

import html as html_lib
import re

HEADING = re.compile(r"<h([1-6])[^>]*\bid=\"([^\"]+)\"[^>]*>(.*?)</h\1>", re.S)


def _text(fragment: str) -> str:
    """Visible text of an HTML fragment: tags and the ¶ permalink dropped, whitespace collapsed."""
    text = html_lib.unescape(re.sub(r"<[^>]+>", "", fragment)).replace("¶", "")
    return re.sub(r"\s+", " ", text).strip()


def _words_in_order(needle: str, hay: str) -> bool:
    """Whether the ``-``-separated words of ``needle`` occur in ``hay``'s words, in order."""
    it = iter(hay.split("-"))
    return all(w in it for w in needle.split("-") if w)


def _flat(items) -> list:
    return [x for item in items for x in (item, *_flat(item.children))]


# A notebook's input and output prompts ("In [3]:") and its copy buttons' "Copied!" notices:
# shown on the page, kept out of the search index (Material's search skips data-search-exclude)
NOT_SEARCHED = re.compile(r"""<(div class="jp-(?:Input|Output)Prompt[^"]*"|span class="notice")""")


def on_page_content(html: str, page, config, files) -> str:
    if not page.file.src_path.endswith(".ipynb"):
        return html
    html = NOT_SEARCHED.sub(lambda m: f"<{m.group(1)} data-search-exclude", html)
    headings = [(hid, _text(inner)) for _, hid, inner in HEADING.findall(html)]
    ids = {hid for hid, _ in headings}
    pos = 0
    for item in _flat(page.toc):
        if item.id in ids:
            pos = next(i for i, (hid, _) in enumerate(headings) if hid == item.id) + 1
            continue
        for i in range(pos, len(headings)):
            if _words_in_order(item.id, headings[i][0]):
                item.id, item.title = headings[i]
                pos = i + 1
                break
    return html


ABSOLUTE_ASSETS = re.compile(r"""(\b(?:src|href)=["'])/(assets/)""")


def on_post_page(output: str, page, config) -> str:
    """Every ``src`` or ``href`` that starts at the site's root ``/assets/`` made relative to the page."""
    depth = page.url.count("/")  # "" at the home page, "notebooks/day_01_naive/" two folders down
    return ABSOLUTE_ASSETS.sub(lambda m: m.group(1) + "../" * depth + m.group(2), output)

