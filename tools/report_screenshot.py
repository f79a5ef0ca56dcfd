"""The README's picture of a report: the top of an audit's index.html in headless Chromium, 1400 px wide.

    python tools/report_screenshot.py reports/llm-7b-pretrain/index.html docs/report.png

Debian's ``chromium`` with Python ``playwright`` (``make setup`` installs it with the test tools; never
``playwright install``). The page is the one ``make report`` writes, so the picture shows today's code:
regenerate it after a change to the report.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"


def shoot(page_path: Path, out: Path, width: int = 1400, height: int = 1100) -> Path:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(page_path.resolve().as_uri())
            page.screenshot(path=str(out), full_page=False)
        finally:
            browser.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("page", type=Path, help="an audit's index.html")
    ap.add_argument("out", type=Path, help="the PNG to write, e.g. docs/report.png")
    a = ap.parse_args(argv)
    if not a.page.is_file():
        print(f"page = {a.page}: not a file; run `make report` first (it prints the path)", file=sys.stderr)
        return 2
    if not Path(CHROMIUM).exists():
        print(f"{CHROMIUM} not found: apt-get install chromium", file=sys.stderr)
        return 2
    print(shoot(a.page, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
