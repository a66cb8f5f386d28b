"""The results folder, read once: the one reader of every file the runs, probes and verifications left behind.

Every answer (the report, the page, `lookup`, `check`, `audit`, the advisories, `upstream-report`) asks the `Atlas`,
and the atlas asks this store; nothing in `publishing/` or the answer commands opens a results file or globs `runs/`
(tests/test_architecture.py holds them to it). A file is read at most once per store, so one report reads each record
file once, however many views ask for it. Records come back named by today's rules (`rename_all`); callers must not
change them in place (the next caller is handed the same dicts).

Layout (`results/`): `runs/<run>/{meta.json,records.jsonl[.xz]}`; probe runs under `flips/`, `bisect/`, `watch/` and
`measured/` (any depth, each a folder with meta.json and records); `flips/<run>/flips.json` (a dated run's named
flips); `watch/<day>/[<profile>/]flips.json` and `watch/<day>/watch.json`; `bisect/<name>/verdict.json`;
`findings/<id>/`; `adapter-grid/<run>/`; `script-bisect/<name>/`; `repros/index.json`.
"""

from __future__ import annotations

import json
import lzma
import tomllib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from harness.errors import UsageError
from harness.paths import (
    ADAPTER_GRID_FOLDER,
    BISECT_FOLDER,
    FINDINGS_FOLDER,
    FLIPS_FILE,
    FLIPS_FOLDER,
    MEASURED_FOLDER,
    META_FILE,
    WATCH_FILE,
    WATCH_FOLDER,
    meta_file,
    records_file,
    runs_folder,
)
from harness.recording import runs
from harness.recording.packing import run_dirs
from harness.recording.records import read_records
from harness.recording.signatures import rename_all

#: Folders of the results that hold probe runs of scenarios (a `bisect-script` verdict's runs are a user's script's).
PROBE_FOLDERS = (FLIPS_FOLDER, BISECT_FOLDER, WATCH_FOLDER, MEASURED_FOLDER)
WITHOUT_A_FINDING = "without-a-finding.toml"


@dataclass(frozen=True)
class AdapterGridRun:
    """One adapter-grid run as its folder holds it: meta.json, the pairs (plain or packed), the saves, and the flips
    `adapters-grid --sweep` named (sweep.json, by flip key; empty where not swept)."""

    folder: Path
    meta: dict[str, Any]
    pairs: list[dict[str, Any]]
    saves: list[dict[str, Any]]
    sweep: dict[str, dict[str, Any]]


def read_adapter_grid(run: Path) -> AdapterGridRun:
    """The one reader of an adapter-grid run folder (the grid's page and its sweep read it alike)."""
    packed = run / "pairs.jsonl.xz"
    text = lzma.decompress(packed.read_bytes()).decode() if packed.is_file() else (run / "pairs.jsonl").read_text()
    saves = (run / "saves.jsonl").read_text().splitlines() if (run / "saves.jsonl").is_file() else []
    sweep = json.loads((run / "sweep.json").read_text()).get("flips", []) if (run / "sweep.json").is_file() else []
    return AdapterGridRun(
        run,
        json.loads(meta_file(run).read_text()),
        [json.loads(x) for x in text.splitlines() if x.strip()],
        [json.loads(x) for x in saves if x.strip()],
        {entry["key"]: entry for entry in sweep},
    )


def read_script_verdict(folder: Path) -> tuple[dict[str, Any], str, list[dict[str, Any]]]:
    """A `bisect-script` verdict folder: (verdict.json, the script it ran, its runs)."""
    verdict = json.loads((folder / "verdict.json").read_text())
    lines = (folder / "runs.jsonl").read_text().splitlines() if (folder / "runs.jsonl").is_file() else []
    return verdict, (folder / "script.py").read_text(), [json.loads(x) for x in lines if x.strip()]


def read_script_blame(folder: Path | None) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """A verdict folder's blame (blame.json, `blame-script`) and the traced comparison beside it (changed.json)."""
    if folder is None or not (folder / "blame.json").is_file():
        return None, None
    changed = folder / "changed.json"
    return json.loads((folder / "blame.json").read_text()), json.loads(
        changed.read_text()
    ) if changed.is_file() else None


class Store:
    """One results folder's files, each read at most once (`reads` counts the record files read, for the bench)."""

    def __init__(self, results_dir: Path) -> None:
        self.results_dir = results_dir
        self._records: dict[Path, list[dict[str, Any]]] = {}
        self.reads = 0

    # --- dated and named runs (results/runs/) ---

    @property
    def runs_root(self) -> Path:
        return runs_folder(self.results_dir)

    @cached_property
    def metas(self) -> dict[str, dict[str, Any]]:
        """run id -> meta.json with the status a reader should see (a `running` run whose writer died is
        `interrupted`), in run id order."""
        root = self.runs_root
        found = {}
        for run_dir in sorted(root.glob("*")) if root.is_dir() else []:
            if meta_file(run_dir).is_file():
                meta = runs.read_meta(run_dir)
                found[run_dir.name] = meta | {"status": runs.effective_status(run_dir, meta)}
        return found

    def run_dir(self, run_id: str) -> Path:
        return self.runs_root / run_id

    def run_records(self, run_id: str, warn: bool = True) -> list[dict[str, Any]]:
        """A run's records (runs/<run>/records.jsonl, plain or packed), named by today's rules."""
        return self.records_in(self.run_dir(run_id), warn)

    def records_in(self, run_dir: Path, warn: bool = True) -> list[dict[str, Any]]:
        """The records of any run folder (a dated run, a probe run), read once, named by today's rules."""
        key = run_dir.resolve()
        if key not in self._records:
            self.reads += 1
            self._records[key] = rename_all(read_records(records_file(run_dir), warn=warn))
        return self._records[key]

    # --- probe runs (flips' moves and sweeps, bisects, the release watch, `lookup --measure`) ---

    @cached_property
    def probe_run_dirs(self) -> dict[str, list[Path]]:
        """folder -> the probe run folders under it (any depth)."""
        found = {}
        for folder in PROBE_FOLDERS:
            root = self.results_dir / folder
            found[folder] = list(run_dirs(root)) if root.is_dir() else []
        return found

    def records_of_run_named(self, name: str) -> list[dict[str, Any]] | None:
        """The records of the run folder of that name anywhere under the results (a finding's probe run), or None."""
        folders = [d for d in self.all_run_dirs if d.name == name]
        return self.records_in(folders[0]) if folders else None

    @cached_property
    def all_run_dirs(self) -> list[Path]:
        return list(run_dirs(self.results_dir))

    @cached_property
    def measured_runs(self) -> dict[str, int]:
        """Each run measured here (`lookup --measure`, `audit --fix --measure`): its run id -> how many records it
        holds. The judge's tables carry the map they were compiled with, so a run measured since is found by what
        the folder holds, never by file times (a clone or a copy sets those anew, in no order)."""
        return {d.name: len(self.records_in(d, warn=False)) for d in self.probe_run_dirs[MEASURED_FOLDER]}

    # --- flips, verdicts, the watch ---

    @cached_property
    def flip_files(self) -> dict[str, list[dict[str, Any]]]:
        """dated run id -> the entries of its results/flips/<run>/flips.json, in run id order."""
        root = self.results_dir / FLIPS_FOLDER
        return {p.parent.name: json.loads(p.read_text()) for p in sorted(root.glob(f"*/{FLIPS_FILE}"))}

    @cached_property
    def watch_flip_entries(self) -> list[dict[str, Any]]:
        """The release watch's named flips (watch/<day>/flips.json and watch/<day>/<profile>/flips.json)."""
        watch = self.results_dir / WATCH_FOLDER
        paths = sorted([*watch.glob(f"*/{FLIPS_FILE}"), *watch.glob(f"*/*/{FLIPS_FILE}")])
        return [entry for path in paths for entry in json.loads(path.read_text())]

    @cached_property
    def newest_watch(self) -> dict[str, Any] | None:
        """The newest release watch's report (watch/<day>/watch.json), or None."""
        watches = sorted((self.results_dir / WATCH_FOLDER).glob(f"*/{WATCH_FILE}"))
        return json.loads(watches[-1].read_text()) if watches else None

    @cached_property
    def bisect_verdict_entries(self) -> list[dict[str, Any]]:
        """Each `compat-matrix bisect` verdict (bisect/<name>/verdict.json), in its folders' order."""
        return [json.loads(p.read_text()) for p in sorted((self.results_dir / BISECT_FOLDER).glob("*/verdict.json"))]

    # --- findings, reproducers, script verdicts, the adapter grid ---

    @cached_property
    def findings(self) -> list[Any]:
        """Every finding (findings/<id>/finding.toml with its verification runs), in id order."""
        from harness.knowledge.findings import load_all

        return load_all(self.results_dir / FINDINGS_FOLDER)

    def finding(self, finding_id: str) -> Any:
        return next(f for f in self.findings if f.id == finding_id)

    @cached_property
    def without_a_finding(self) -> dict[str, list[dict[str, str]]]:
        """The flips and failure families no upstream record names that have no finding, each with why not
        (findings/without-a-finding.toml)."""
        path = self.results_dir / FINDINGS_FOLDER / WITHOUT_A_FINDING
        if not path.is_file():
            return {"flip": [], "family": []}
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"{path}: {exc}") from None
        return {"flip": list(data.get("flip") or []), "family": list(data.get("family") or [])}

    @cached_property
    def repro_index(self) -> list[dict[str, Any]]:
        """The reproducers the report wrote (repros/index.json), or none."""
        path = self.results_dir / "repros" / "index.json"
        return json.loads(path.read_text()) if path.is_file() else []

    def repro_source(self, file: str, repros: Path | None = None) -> str:
        return ((repros or self.results_dir / "repros") / file).read_text()

    @cached_property
    def newest_adapter_grid(self) -> AdapterGridRun | None:
        """The newest finished adapter-grid run (adapter-grid/<run>/), or None."""
        metas = sorted((self.results_dir / ADAPTER_GRID_FOLDER).glob(f"*/{META_FILE}"))
        done = [p.parent for p in metas if json.loads(p.read_text()).get("status") == "done"]
        return read_adapter_grid(done[-1]) if done else None
