"""The page's answer (read.js and judge.js, in a real headless Chromium) and `compat-matrix audit` agree on the same
input: the same answers, states, reasons, certainty and way out, over the committed judge's tables, for pasted
requirements files, pip freezes and lockfiles, every setup the page offers and every GPU count. Then the page as a user
reads it: the issue's own case at 1,400 px, a linked URL restoring the setup, and a phone's 420 px with nothing off the
edge."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from harness.publishing.publish import build_matrix, write_site
from harness.tools.answers.audit import audit, load_tables, query_of
from harness.tools.user_files.pins import read_pins
from harness.tools.user_files.user_configs import read_setup
from tests.conftest import REPO_ROOT, screenshot_path
from tests.test_judge_vectors import WITH_FIXES, python_answers, vectors
from tests.test_publish import headless_chromium, open_page

RESULTS = REPO_ROOT / "results"
PACKAGES = ("torch", "transformers", "peft", "accelerate", "deepspeed", "bitsandbytes")
ENGINES = ("", "single", "ddp", "fsdp1", "fsdp2", "zero3")
ADAPTERS = ("", "lora", "dora", "qlora")
GPUS = (None, 0, 1, 2, 4)
#: The issue's case: FSDP2 + LoRA on 2 GPUs at these releases resumes wrong until accelerate 1.15.0.
ISSUE_CASE = "torch==2.11.0\ntransformers==5.14.1\npeft==0.20.0\naccelerate==1.14.0\n"


def releases() -> dict[str, list[str]]:
    """Every release the judge's tables name per package (measured, and every segment's bound), plus releases they never
    measured."""
    found: dict[str, set[str]] = {p: {"0.0.1", "99.0.0"} for p in PACKAGES}
    tables = load_tables(RESULTS)
    for package, values in tables["releases"].items():
        found.setdefault(package, set()).update(values)
    for failure in tables["failures"]:
        for package, segments in failure["segments"].items():
            found[package].update(v for s in segments for v in (s[0], s[2]) if v)
    found["accelerate"].add("1.14.1")  # inside a failing range, not measured
    return {p: sorted(v) for p, v in found.items()}


def inputs(count: int, seed: int = 20261128) -> list[tuple[str, str, str, str, int | None]]:
    """(file name, text, engine, adapter, gpus): requirements with exact pins (some packages left out), pip freezes
    with other packages, uv.lock / poetry.lock / pylock.toml, loose requirements, and the issue's case."""
    rng = random.Random(seed)
    known = releases()
    made = [("requirements.txt", ISSUE_CASE, "fsdp2", "lora", 2)]
    for n in range(count):
        chosen = {p: rng.choice(known[p]) for p in PACKAGES if rng.random() < 0.85}
        kind = rng.choice(["requirements.txt", "freeze.txt", "uv.lock", "poetry.lock", "pylock.toml", "loose.txt"])
        if kind == "requirements.txt":
            text = "".join(f"{p}=={v}  # pinned\n" for p, v in chosen.items())
        elif kind == "freeze.txt":
            text = "".join(f"{p.upper() if n % 3 == 0 else p}=={v}\n" for p, v in chosen.items()) + "numpy==2.1.0\n"
        elif kind == "loose.txt":
            text = "".join(
                f"{p}>={v}\n" if rng.random() < 0.5 else f"{p}~={v}\n" if v.count(".") else f"{p}=={v}\n"
                for p, v in chosen.items()
            )
        elif kind == "pylock.toml":
            text = 'lock-version = "1.0"\n' + "".join(
                f'\n[[packages]]\nname = "{p}"\nversion = "{v}"\n\n[[packages.wheels]]\nname = "x.whl"\n'
                for p, v in chosen.items()
            )
        else:
            text = "version = 1\n" + "".join(
                f'\n[[package]]\nname = "{p}"\nversion = "{v}"\nsource = {{ registry = "https://pypi.org/simple" }}\n'
                f'dependencies = [\n    {{ name = "filelock" }},\n]\n\n[package.metadata]\nrequires-dist = []\n'
                for p, v in chosen.items()
            )
        made.append((kind, text, rng.choice(ENGINES), rng.choice(ADAPTERS), rng.choice(GPUS)))
    return made


def audit_json(tmp_path: Path, name: str, text: str, words: list[str], gpus: int | None) -> dict[str, Any]:
    """What `compat-matrix audit FILE --setup WORDS [--gpus N]` judges, as data: the answers shown, the way out."""
    path = tmp_path / name
    path.write_text(text)
    found = read_pins(path)
    setup = read_setup(None, None, words).setup
    tables = load_tables(RESULTS)
    report = audit(tables, query_of(tables, found.pins, setup, found.loose, found.partial, gpus, None, []))
    return json.loads(json.dumps({"answers": report.answers, "way_out": report.way_out}))


VECTORS = """
const tables = window.COMPAT_JUDGE, withFixes = arguments[1];
const out = arguments[0].map((q) => { const a = CompatJudge.evaluate(tables, q);
  const fixes = {};
  for (const x of a) {
    if (withFixes.includes(x.state)) {
      fixes[x.id] = CompatJudge.fixAnswers(tables, tables.failures.find((f) => f.id === x.id), q);
    }
  }
  return { answers: a, way_out: CompatJudge.wayOut(tables, q, a), fixes }; });
return JSON.stringify(out);
"""


#: The page's own answer for a pasted text and a setup: its state set as the controls set it, then its renderAnswer.
PAGE_ANSWER = """
const [text, setup, gpus] = arguments;
for (const key of ["engine", "adapter", "loop", "state_dict"]) state[key] = setup[key] || "";
state.gpus = gpus === null ? "" : String(gpus);
document.getElementById("answer-paste").value = text;
readPasted();
return JSON.stringify(window.__answer);
"""


def site(tmp_path: Path) -> Path:
    from harness.define.registry import discover
    from harness.knowledge.atlas import Atlas
    from harness.publishing.adapter_grid import document as adapter_grid_document
    from harness.publishing.findings import findings_rows
    from harness.publishing.growth import lately

    atlas = Atlas(RESULTS, {s.id: s.spec for s in discover()})
    document = build_matrix(atlas)
    # as publish() makes it: the findings (their "changed:" lists), what changed lately, the adapters grid
    document["findings"] = findings_rows(atlas.store)
    document["lately"] = lately(atlas)
    document["adapter_grid"] = adapter_grid_document(atlas.store)
    return write_site(document, tmp_path / "site", RESULTS / "advisories")


def test_the_page_and_audit_agree_on_the_same_input(tmp_path: Path) -> None:
    page = site(tmp_path)
    cases = inputs(240)
    browser = headless_chromium()
    try:
        browser.get(page.as_uri())
        assert browser.execute_script("return window.COMPAT_JUDGE.failures.length") == len(
            load_tables(RESULTS)["failures"]
        )
        states: dict[str, int] = {}
        for name, text, engine, adapter, gpus in cases:
            words = [w for w in (engine, adapter) if w]
            expected = audit_json(tmp_path, name, text, words, gpus)
            setup = read_setup(None, None, words).setup
            got = json.loads(browser.execute_script(PAGE_ANSWER, text, setup, gpus))
            assert got == expected, f"{name} {engine} {adapter} gpus={gpus}\n{text}"
            for answer in expected["answers"]:
                states[answer["state"]] = states.get(answer["state"], 0) + 1
        print(f"{len(cases)} inputs agree; answers by state: {states}")
        assert {"applies", "undecided", "range", "pitfall"} <= set(states), "the inputs reach every state audit gives"
        bad = browser.execute_script(
            "try { CompatRead.readPins('torch=>2 what'); return null } catch (e) { return e.message }"
        )
        assert bad and "not a requirement" in bad
        # The judge's test vectors, judged by the page's own site_judge.js in the browser: Python's answers.
        tables = load_tables(RESULTS)
        queries = vectors(tables, count=60)
        got = json.loads(browser.execute_script(VECTORS, queries, list(WITH_FIXES)))
        assert got == python_answers(tables, queries)
    finally:
        browser.quit()


#: The page's answer for pasted pins and a pasted config: both read as a user reads them, with the buttons.
PAGE_CONFIG_ANSWER = """
const [text, config] = arguments;
for (const key of Object.keys(state)) delete state[key];
document.getElementById("answer-paste").value = text;
readPasted();
document.getElementById("answer-config").value = config;
readConfigPasted();
return JSON.stringify([window.__answer, document.getElementById("answer-config-error").textContent]);
"""


def test_the_page_reads_a_pasted_config_as_audit_reads_the_file(tmp_path: Path) -> None:
    """The five projects' real configs, pasted under a real project's pins: the page's answer is audit's for the same
    files (`--accelerate-config`, `--deepspeed-config`, `--trainer-config`), settings that are fixes and the GPU count
    included; a config the page cannot read leaves no answer on screen."""
    configs = REPO_ROOT / "examples" / "audit" / "configs"
    pins_file = REPO_ROOT / "examples" / "audit" / "axolotl.requirements.txt"
    pins_text = pins_file.read_text()
    found = read_pins(pins_file)
    tables = load_tables(RESULTS)
    page = site(tmp_path)
    browser = headless_chromium()
    try:
        browser.get(page.as_uri())
        for source in json.loads((configs / "SOURCES.json").read_text()):
            path = configs / source["file"]
            kind = source["kind"]
            if source.get("follows"):  # a config naming another file: the page says it cannot open it
                _, error = json.loads(browser.execute_script(PAGE_CONFIG_ANSWER, pins_text, path.read_text()))
                assert "a file this page cannot open" in error, source["file"]
                continue
            user = read_setup(path if kind == "accelerate" else None, path if kind == "deepspeed" else None, [],
                              path if kind == "trainer" else None, found.pins)  # fmt: skip
            query = query_of(tables, found.pins, user.setup, found.loose, found.partial, user.gpus, None, [])
            report = audit(tables, query)
            expected = json.loads(json.dumps({"answers": report.answers, "way_out": report.way_out}))
            got, error = json.loads(browser.execute_script(PAGE_CONFIG_ANSWER, pins_text, path.read_text()))
            assert error == "" and got == expected, source["file"]
        got, error = json.loads(
            browser.execute_script(
                PAGE_CONFIG_ANSWER, pins_text, "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 3\n"
            )
        )
        assert got is None and "fsdp_config.fsdp_version" in error
    finally:
        browser.quit()


def test_a_pasted_requirements_file_gives_the_failure_and_the_way_out_and_the_link_keeps_it(tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    page = site(tmp_path)
    expected = audit_json(tmp_path, "requirements.txt", ISSUE_CASE, ["fsdp2", "lora"], 2)
    resume = [a for a in expected["answers"] if a["id"] == "x_COMPAT-MATRIX-S9-cuda-3a1bd84d0d"]
    assert resume and resume[0]["state"] == "applies" and resume[0]["sure"] == "exact"
    assert expected["way_out"]["pins"] == {"accelerate": "1.15.0"}
    browser = headless_chromium()
    try:
        open_page(browser, page.as_uri(), 1400)
        Select(browser.find_element(By.ID, "setup-engine")).select_by_value("fsdp2")
        Select(browser.find_element(By.ID, "setup-adapter")).select_by_value("lora")
        Select(browser.find_element(By.ID, "setup-gpus")).select_by_value("2")
        browser.find_element(By.ID, "answer-paste").send_keys(ISSUE_CASE)
        browser.find_element(By.ID, "answer-read").click()
        assert json.loads(browser.execute_script("return JSON.stringify(window.__answer)")) == expected
        item = browser.find_element(By.CSS_SELECTOR, '#answer-list li[data-id="x_COMPAT-MATRIX-S9-cuda-3a1bd84d0d"]')
        assert item.get_attribute("data-state") == "applies"
        assert "resume" in item.text and "upgrade accelerate to 1.15.0 (measured): ends it" in item.text
        assert "records at exactly these releases" in item.text
        assert "accelerate==1.15.0" in browser.find_element(By.ID, "answer-pins").text
        browser.save_screenshot(str(screenshot_path("answer-1400.png")))
        link = browser.current_url
        for key in ("engine=fsdp2", "adapter=lora", "gpus=2", "v-accelerate=1.14.0", "src=requirements"):
            assert key in link, key
        browser.get("about:blank")
        browser.get(link)  # a linked answer: the setup and the versions come back, and so does the answer
        WebDriverWait(browser, 60).until(lambda b: b.execute_script("return window.__answerRenderedAt !== undefined"))
        chosen = {
            box: Select(browser.find_element(By.ID, box)).first_selected_option.get_attribute("value")
            for box in ("setup-engine", "setup-gpus", "version-peft")
        }
        assert chosen == {"setup-engine": "fsdp2", "setup-gpus": "2", "version-peft": "0.20.0"}
        assert json.loads(browser.execute_script("return JSON.stringify(window.__answer)")) == expected
    finally:
        browser.quit()


def test_at_1400_px_every_column_is_on_the_first_screen_and_the_identities_open(tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    page = site(tmp_path)
    browser = headless_chromium()
    try:
        open_page(browser, page.as_uri(), 1400)
        width = browser.execute_script("return document.documentElement.clientWidth")
        for table in browser.find_elements(By.CSS_SELECTOR, "table.glance"):
            heads = table.find_elements(By.CSS_SELECTOR, "th.col")
            assert heads and all(h.location["x"] + h.size["width"] <= width for h in heads), table.get_attribute("id")
            box = table.find_element(By.XPATH, "..")
            assert not browser.execute_script("return arguments[0].scrollWidth > arguments[0].clientWidth", box)
        folds = browser.find_elements(By.CSS_SELECTOR, "#glance-0 th.fold")
        assert folds and folds[0].text.startswith("S9 (5)")
        folds[0].click()  # the five identities open as their own columns, still on the screen
        WebDriverWait(browser, 10).until(lambda b: "unfold=S9" in b.current_url)
        heads = browser.find_elements(By.CSS_SELECTOR, "#glance-0 th.col")
        assert sum(1 for h in heads if (h.get_attribute("data-scenario") or "").startswith("S9-")) == 5
        assert all(h.location["x"] + h.size["width"] <= width for h in heads)
        assert browser.execute_script("return document.documentElement.scrollWidth") <= width
        text = browser.find_element(By.ID, "glance").text
        assert "flip_use_orig_params" not in text and "use_orig_params flipped, wrap each decoder layer" in text
        browser.save_screenshot(str(screenshot_path("glance-1400.png")))
    finally:
        browser.quit()


#: The detail grid as a reader sees it: its box's overflow, and each cell name's lines.
DETAIL_GRID = """
const grid = document.getElementById("grid"), box = grid.parentElement;
const line = parseFloat(getComputedStyle(grid).fontSize) * 1.6;
const names = [...grid.querySelectorAll("tr.cellname th")];
return JSON.stringify({
  width: Math.round(grid.getBoundingClientRect().width), box: box.clientWidth, scroll: box.scrollWidth,
  names: names.length, entries: grid.querySelectorAll("td.entry").length,
  tall: names.filter((n) => n.getBoundingClientRect().height > 2 * line || n.scrollWidth > n.clientWidth + 1)
    .map((n) => n.textContent).slice(0, 3),
  page: document.documentElement.scrollWidth, viewport: document.documentElement.clientWidth,
});
"""


def test_at_1400_px_the_detail_grid_has_no_sideways_scroll_and_names_on_one_line(tmp_path: Path) -> None:
    """Every entry, every record: at 1,400 px the grid of cells by scenarios fits its box (it was 1,822 px wide inside
    1,321, its cell column 30 px wide, a name one character a line), each cell's name on one line."""
    page = site(tmp_path)
    browser = headless_chromium()
    try:
        open_page(browser, page.as_uri(), 1400, "__recordsRenderedAt", 120)
        found = json.loads(browser.execute_script(DETAIL_GRID))
        assert found["names"] >= 20 and found["entries"] >= 20 * 10, found
        assert found["scroll"] <= found["box"] and found["width"] <= found["box"], found
        assert not found["tall"], found
        assert found["page"] <= found["viewport"], found
        browser.execute_script("document.getElementById('grid').scrollIntoView()")
        browser.save_screenshot(str(screenshot_path("detail-grid-1400.png")))
    finally:
        browser.quit()


WIDER_THAN_THE_VIEWPORT = """
const width = document.documentElement.clientWidth;
return [...document.querySelectorAll('body *')].filter(e => {
  const box = e.getBoundingClientRect();
  return box.width > 0 && box.right > width + 1;
}).slice(0, 8).map(e => `${e.tagName}#${e.id}.${e.className} right=${Math.round(e.getBoundingClientRect().right)}`);
"""


@pytest.mark.parametrize("opened", [False, True], ids=["closed", "every-fold-open"])
def test_at_420_px_the_answer_comes_first_and_nothing_runs_off_the_edge(tmp_path: Path, opened: bool) -> None:
    from selenium.webdriver.common.by import By

    page = site(tmp_path)
    browser = headless_chromium()
    try:
        link = page.as_uri() + "#engine=fsdp2&adapter=lora&gpus=2&src=requirements&v-torch=2.11.0&v-transformers=5.14.1"
        open_page(browser, link + "&v-peft=0.20.0&v-accelerate=1.14.0", 420, "__recordsRenderedAt", 120)
        answer = browser.find_element(By.ID, "answer-section").location["y"]
        grid = browser.find_element(By.ID, "glance-section").location["y"]
        assert answer < grid, "the answer first, then the grid"
        assert browser.find_elements(By.CSS_SELECTOR, "#answer-list li.st-applies")
        assert not browser.find_element(By.CSS_SELECTOR, ".glance-scroll").is_displayed()
        assert browser.find_element(By.CSS_SELECTOR, ".glance-narrow").is_displayed()
        if opened:
            # every fold open, and one entry's failing record shown with its message, versions and config
            browser.execute_script("document.querySelectorAll('details').forEach(d => d.open = true)")
            browser.find_element(By.CSS_SELECTOR, "#grid td.entry.fail[data-key]").click()
            browser.find_element(By.CSS_SELECTOR, "#record-list li").click()
            assert browser.find_element(By.ID, "record-message").is_displayed()
        off = browser.execute_script(WIDER_THAN_THE_VIEWPORT)
        assert not off, off
        width = browser.execute_script("return document.documentElement.clientWidth")
        assert browser.execute_script("return document.documentElement.scrollWidth") <= width
        browser.save_screenshot(str(screenshot_path(f"page-420-{'open' if opened else 'closed'}.png")))
    finally:
        browser.quit()
