"""python -m website: build the series as a static site from the committed, executed notebooks.

    python -m website                     # build into build/site (open build/site/index.html
                                          #   through a web server: python -m http.server -d build/site)
    python -m website --out DIR           # build into DIR
    python -m website --screenshots       # also rewrite website/screenshots/*.png (needs Chromium)
    python -m website --repo-url URL      # link the navigation to the repository at URL (default:
                                          #   $CONV2D_DAYS_REPO_URL, else the checkout's origin remote)

No GPU and no notebook execution: the pages show the outputs the notebooks were committed with.
Exit status: 0 when built, 1 when the build failed (a broken link, MkDocs' own errors), with the
reason on stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from website.build import BUILD_DIR, BuildError, build, repository_url


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m website", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=BUILD_DIR, help=f"output folder (default {BUILD_DIR})")
    ap.add_argument("--screenshots", action="store_true", help="also write website/screenshots/*.png")
    ap.add_argument("--repo-url", help="the repository the navigation links to (default: "
                    "$CONV2D_DAYS_REPO_URL, else the origin remote's web URL; none: no link)")
    args = ap.parse_args(argv)
    try:
        out = build(args.out, repo_url=args.repo_url if args.repo_url is not None else repository_url())
    except BuildError as e:
        print(f"python -m website: {e}", file=sys.stderr)
        return 1
    print(f"built {out}")
    if args.screenshots:
        from website.browse import write_screenshots

        for p in write_screenshots(out):
            print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
