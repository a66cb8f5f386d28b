"""How fast the site shows its answer: first render of the answer grid in headless Chromium, today's layout (a
small page, the grid's data in `data/glance.js`, every record in `data/matrix.js` loaded afterwards) against the
single page it replaced (every record inline, parsed before anything renders). Both pages are built from the
same records in one temporary folder and loaded alternately, so the ratio compares like with like."""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path
from typing import Any

from harness.knowledge.atlas import Atlas
from harness.publishing.publish import build_matrix, write_site


def inline_page(site: Path) -> Path:
    """The same page with both data files inlined before the app script: the old single-file layout."""
    page = (site / "index.html").read_text()
    glance = (site / "data" / "glance.js").read_text()
    records = (site / "data" / "matrix.js").read_text()
    page = page.replace(
        '<script src="data/glance.js"></script>', f"<script>{glance}</script><script>{records}</script>"
    )
    page = page.replace('script.src = "data/matrix.js";', 'script.src = "data:text/javascript,";')
    out = site / "inline.html"
    out.write_text(page)
    return out


def bench_site(results_dir: Path, workdir: Path, loads: int = 5) -> dict[str, Any]:
    """Median (and min, max) ms from navigation start to the answer grid and to the full record grid."""
    from harness.define.registry import discover

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        raise RuntimeError(
            "the site benchmark needs chromium and chromedriver (Debian: apt-get install chromium chromium-driver)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    document = build_matrix(Atlas(results_dir, {s.id: s.spec for s in discover()}))
    site = write_site(document, workdir / "site")
    pages = {"split (today)": site, "inline (before)": inline_page(site.parent)}
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    browser = webdriver.Chrome(service=Service(driver), options=options)
    samples: dict[str, dict[str, list[float]]] = {name: {"glance_ms": [], "records_ms": []} for name in pages}
    try:
        for _ in range(loads):
            for name, page in pages.items():
                browser.get("about:blank")
                browser.get(page.as_uri())
                WebDriverWait(browser, 120).until(
                    lambda b: b.execute_script("return window.__recordsRenderedAt !== undefined")
                )
                samples[name]["glance_ms"].append(browser.execute_script("return window.__glanceRenderedAt"))
                samples[name]["records_ms"].append(browser.execute_script("return window.__recordsRenderedAt"))
    finally:
        browser.quit()
    summary: dict[str, Any] = {
        "loads": loads,
        "page_bytes": site.stat().st_size,
        "glance_bytes": (site.parent / "data" / "glance.js").stat().st_size,
        "records_bytes": (site.parent / "data" / "matrix.js").stat().st_size,
    }
    for name, kinds in samples.items():
        summary[name] = {
            kind: {"min": min(v), "median": statistics.median(v), "max": max(v)} for kind, v in kinds.items()
        }
    before, today = summary["inline (before)"]["glance_ms"]["median"], summary["split (today)"]["glance_ms"]["median"]
    summary["glance_before_over_today"] = before / today if today else None
    return summary
