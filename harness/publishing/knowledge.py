"""What the atlas knows, in one place: each failure per setup, the releases measured bad and good, the way out, and
the pitfalls (configs that fail on every release measured, a property of the setup, not of a version).

The glance, `check`, `lookup` and the advisories are views of this module, never four walks over the records:
- `pitfalls`: a config that shows its scenario's target on every install day it ran on a device class (at least
  `PITFALL_STACKS` different stacks), never failing another way there and never passing in any record of that device
  (probes and sweeps included), is a pitfall. It is listed once, apart, and never counts in a stack's k/n, in a flip or
  in "what changed lately". The records decide; a scenario's SPEC `own_code` only words why (S9's loops written by
  hand: off on every release, by their own arithmetic).
- `setup_of` / `setup_words`: a config's setup (engine, Trainer or a loop by hand, adapter, ...) as a user names it.
- `probe_records`: the records of the probes of flips, sweeps, bisects and the watch, for answers at the exact
  releases a user runs.
- `changes_for`: the releases the flips and sweeps name for a scenario's configs (started / ended, with the last
  release before), per device class, with the runs behind them.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.define.packages import AXIS_PACKAGES, public_version
from harness.define.profile import DATE_AXIS
from harness.recording.flip import Flip
from harness.recording.outcomes import BAD, UNUSABLE
from harness.recording.packing import run_dirs
from harness.recording.records import read_records
from harness.recording.signatures import rename_all
from harness.recording.verdicts import matches
from scenarios.failure_names import family as failure_family
from scenarios.failure_names import upstream_packages

#: A pitfall needs the failure on at least this many different stacks (one stack twice is one release).
PITFALL_STACKS = 3
#: Config keys that name a setup, in the order a user says them.
SETUP_KEYS = ("path", "order", "engine", "launch", "context", "adapter", "quant")
#: Setup values in words.
SETUP_WORDS = {
    "trainer": "the Trainer",
    "accelerate": "accelerate's loop by hand",
    "hand": "a loop by hand",
    "manual": "FSDP by hand",
    "ddp": "DDP",
    "fsdp1": "FSDP1",
    "fsdp2": "FSDP2",
    "zero3": "ZeRO-3",
    "lora": "LoRA",
    "dora": "DoRA",
    "qlora": "QLoRA",
    "none": "full fine-tune",
    "full_state_dict": "FULL_STATE_DICT",
    "sharded_state_dict": "SHARDED_STATE_DICT",
    "4bit": "4-bit",
    "compile_then_peft": "torch.compile, then the adapter",
    "ckpt_then_peft": "checkpointing, then the adapter",
    "peft_then_ckpt": "the adapter, then checkpointing",
    "peft_then_compile": "the adapter, then torch.compile",
}


def named_packages(targets: Iterable[str]) -> set[str]:
    """The packages the upstream record names for a scenario's target failures (any direction): where a release of
    one can change the outcome, so two install days that agree are still swept over its releases between them."""
    return set().union(*(upstream_packages(t) for t in targets)) if targets else set()


def device_class(record: dict[str, Any]) -> str:
    """'cpu' or 'cuda': a pitfall on GPUs may pass on CPU (another kernel), so each device class has its own."""
    return str((record.get("hardware") or {}).get("device") or "cpu")


def setup_of(config: dict[str, Any] | None, spec: dict[str, Any] | None = None) -> dict[str, str]:
    """The config's setup: the values of its setup keys ({'path': 'trainer', 'engine': 'fsdp2', 'adapter': 'lora'}),
    over what every config of its scenario is (SPEC `setup`: S4 is ZeRO-3) where the config does not say."""
    config = config or {}
    own = {k: str(config[k]) for k in SETUP_KEYS if config.get(k) not in (None, "")}
    return {k: str(v) for k, v in ((spec or {}).get("setup") or {}).items()} | own


def setup_words(config: dict[str, Any] | None, spec: dict[str, Any] | None = None) -> str:
    """'the Trainer · FSDP2 · LoRA'; 'the seed setup' where the config names none."""
    found = setup_of(config, spec)
    ordered = [found[k] for k in SETUP_KEYS if k in found]
    return " · ".join(SETUP_WORDS.get(v, v) for v in ordered) or "the seed setup"


def matches_setup(config: dict[str, Any] | None, wanted: Iterable[str]) -> bool:
    """Whether a config is the user's setup: every word asked for ('fsdp2', 'lora', 'trainer') is one of its setup
    values (a scenario without that key, e.g. no engine, is not excluded by it)."""
    values = set(setup_of(config).values())
    keys = set(setup_of(config))
    for word in wanted:
        key = _key_of(word)
        if key in keys and word not in values:
            return False
    return True


def setup_key(word: str) -> str | None:
    """The setup key a user's word is a value of ('fsdp2' -> 'engine'), or None."""
    return _key_of(word)


def _key_of(word: str) -> str | None:
    """The setup key a user's word is a value of ('fsdp2' -> 'engine'), or None."""
    known = {
        "engine": ("single", "ddp", "fsdp1", "fsdp2", "zero2", "zero3"),  # single: one process, no engine
        "adapter": ("lora", "dora", "qlora", "none"),
        "path": ("trainer", "accelerate", "hand"),
        "context": ("full_state_dict", "sharded_state_dict"),
    }
    return next((k for k, values in known.items() if word in values), None)


@dataclass
class Pitfall:
    """A config that fails on every release measured on a device class."""

    scenario: str
    config_id: str
    device: str
    config: dict[str, Any]
    family: str
    stacks: int
    first_day: str
    last_day: str
    #: The smallest and largest discrepancy (S9's off_by), where the scenario measures one.
    off_by: tuple[float, float] | None = None
    #: The variants that passed on this config on its newest day (the way out).
    fixes: list[str] = field(default_factory=list)

    def words(self, spec: dict[str, Any] | None) -> str:
        """Why it fails on every release: the scenario's own words for this setup (SPEC own_code), else neutral."""
        for condition, text in ((spec or {}).get("own_code") or {}).items():
            key, _, value = condition.partition("=")
            if str(self.config.get(key)) == value:
                return text
        return "fails on every release measured: a pitfall of this setup, not of a version"


def _evidence(record: dict[str, Any], spec: dict[str, Any] | None) -> str:
    """'shows', 'passes', 'other' (failed another way) or 'none' (could not run here, not applicable, a skip)."""
    outcome = record["outcome"]
    if outcome == "pass":
        return "passes"
    if outcome in UNUSABLE or outcome == "skip" or record.get("signature") == "not-applicable":
        return "none"
    target = list((spec or {}).get("target") or [])
    if outcome in BAD and matches(record.get("signature"), target):
        return "shows"
    return "other" if outcome in BAD else "none"


def pitfalls(
    records: list[dict[str, Any]], specs: dict[str, dict[str, Any]], probes: Iterable[dict[str, Any]] = ()
) -> dict[tuple[str, str], Pitfall]:
    """Each pitfall, keyed by `pitfall_key` (scenario and device class, config id). The table's records (`records`,
    the newest evidence per key) decide on the atlas days; any record of the config that passes, among them or among
    the `probes` (flips' moves and sweeps, bisects, the watch), rules it out."""
    baseline: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        if record["variant"] == "baseline" and record["scenario"] in specs:
            baseline[(record["scenario"], device_class(record), record["config_id"])].append(record)
    passed = {
        (r["scenario"], device_class(r), r["config_id"])
        for r in probes
        if r["variant"] == "baseline" and r["outcome"] == "pass"
    }
    found: dict[tuple[str, str], Pitfall] = {}
    for (scenario, device, config_id), mine in baseline.items():
        spec = specs.get(scenario)
        judged = [(r, _evidence(r, spec)) for r in mine]
        if (scenario, device, config_id) in passed or any(e == "passes" for _, e in judged):
            continue
        dated = [(r, e) for r, e in judged if (r.get("pins") or {}).get(DATE_AXIS)]
        if any(e == "other" for _, e in dated):
            continue  # failed another way on some day: the failure's history is a version's, not the setup's
        shown = [r for r, e in dated if e == "shows"]
        stacks = {_stack(r) for r in shown}
        families = {failure_family(r.get("signature")) for r in shown}
        if len(stacks) < PITFALL_STACKS or len(families) != 1:
            continue
        days = sorted(str(r["pins"][DATE_AXIS]) for r in shown)
        sizes = [float(x) for r in shown if isinstance(x := (r.get("metrics") or {}).get("off_by"), int | float)]
        newest = max(shown, key=lambda r: r["pins"][DATE_AXIS])
        found[pitfall_key(scenario, device, config_id)] = Pitfall(
            scenario, config_id, device, dict(newest.get("config") or {}), families.pop(), len(stacks), days[0],
            days[-1], (min(sizes), max(sizes)) if sizes else None, _passing_fixes(records, newest),
        )  # fmt: skip
    return found


def pitfall_key(scenario: str, device: str, config_id: str) -> tuple[str, str]:
    return (f"{scenario}@{device}", config_id)


def is_pitfall(record: dict[str, Any], found: dict[tuple[str, str], Pitfall]) -> bool:
    return pitfall_key(record["scenario"], device_class(record), record["config_id"]) in found


def without_pitfalls(
    records: list[dict[str, Any]], found: dict[tuple[str, str], Pitfall]
) -> tuple[list[dict[str, Any]], set[str]]:
    """The records that are not of a pitfall config (every variant of it), and the pitfall configs left out."""
    kept, left_out = [], set()
    for record in records:
        if is_pitfall(record, found):
            left_out.add(record["config_id"])
        else:
            kept.append(record)
    return kept, left_out


def _stack(record: dict[str, Any]) -> tuple[str, ...]:
    versions = record.get("versions") or {}
    return tuple(str(public_version(str(versions.get(p) or ""))) for p in AXIS_PACKAGES)


def _passing_fixes(records: list[dict[str, Any]], newest: dict[str, Any]) -> list[str]:
    """The variants that passed on the config in the newest day's cell."""
    return sorted(
        {
            r["variant"]
            for r in records
            if r["cell"] == newest["cell"] and r["config_id"] == newest["config_id"]
            and r["scenario"] == newest["scenario"] and r["variant"] != "baseline" and r["outcome"] == "pass"
        }
    )  # fmt: skip


#: Folders of the results that hold probe runs of scenarios (a `bisect-script` verdict's runs are a user's script's).
PROBE_FOLDERS = ("flips", "bisect", "watch", "measured")


def probe_records(results_dir: Path) -> list[dict[str, Any]]:
    """Every record of every probe run (flips' moves and sweeps, bisects, the release watch, `lookup --measure`),
    named by today's rules: evidence at exact releases beside the table's install days."""
    found = []
    for folder in PROBE_FOLDERS:
        for run_dir in run_dirs(results_dir / folder) if (results_dir / folder).is_dir() else []:
            found += rename_all(read_records(run_dir / "records.jsonl", warn=False))
    return found


@dataclass(frozen=True)
class Change:
    """A release that changed a scenario's outcome on some configs, as a flip or a sweep measured it."""

    scenario: str
    package: str
    release: str
    last_before: str | None
    direction: str  # "started" | "ended"
    config_ids: tuple[str, ...]
    device: str
    run_id: str | None
    #: Whether `last_before` was measured in the older state (a pass before an onset): False where it failed another
    #: way (a bisect's "first shows; before it ..."), so it is no release to pin.
    before_measured: bool = True
    #: The failure's name (the flip's or the finding's).
    signature: str | None = None
    #: The verified finding that measured this change (its reproducer at both releases), where one did.
    finding: str | None = None


def changes_for(flips: Iterable[Flip], atlas_of_run: dict[str, str]) -> list[Change]:
    """Every change the flips name, each sweep change on its own (in order), else the flip's named release."""
    found = []
    for flip in flips:
        device = atlas_of_run.get(flip.run_id or "", "cpu").split("-")[0]
        ids = tuple(flip.config_ids)
        if flip.changes:
            for change in flip.changes:
                found.append(Change(str(flip.scenario), change["package"], change["release"],
                                    change.get("last_before"), change["direction"], ids, device, flip.run_id,
                                    signature=flip.signature))  # fmt: skip
        elif flip.package and flip.release:
            # A bisect's note says the release before the named one was no evidence (another failure came first).
            found.append(Change(str(flip.scenario), flip.package, flip.release, flip.last_release_before,
                                flip.direction, ids, device, flip.run_id, before_measured=not flip.note,
                                signature=flip.signature))  # fmt: skip
    return found


def finding_changes(results_dir: Path) -> list[Change]:
    """The release each verified finding names, as a change of its scenario's configs: its reproducer flipped at
    both releases with every other pin held (`findings --verify`), the evidence a masked flip could not give."""
    from harness.publishing.findings import load_all

    found = []
    for finding in load_all(results_dir / "findings"):
        if not finding.verified:
            continue
        family = str(finding.flip.get("family") or "")
        config = finding.probe.get("config") or (family.removeprefix("config-") if family.startswith("config-") else "")
        starts = finding.direction == "starts"
        found.append(Change(
            finding.scenario, finding.package, finding.bad if starts else finding.good,
            finding.good if starts else finding.bad, "started" if starts else "ended",
            (config,) if config else (), "cuda" if finding.gpus else "cpu", None, signature=finding.signature,
            finding=finding.id,
        ))  # fmt: skip
    return found


def atlas_of_runs(records: list[dict[str, Any]]) -> dict[str, str]:
    """run id -> its atlas ('cpu', 'cuda', 'cuda-ws2'), from the records (publishing.atlas.atlas_of's rule)."""
    found: dict[str, str] = {}
    for record in records:
        if record.get("run_id") in found:
            continue
        hardware = record.get("hardware") or {}
        device, gpus = str(hardware.get("device") or "cpu"), int(hardware.get("gpu_count") or 0)
        found[str(record.get("run_id"))] = f"{device}-ws{gpus}" if device == "cuda" and gpus > 1 else device
    return found


def flips_everywhere(results_dir: Path) -> list[Flip]:
    """Every flip of every dated run (results/flips/<run>/flips.json), each with its run id."""
    found = []
    for path in sorted((results_dir / "flips").glob("*/flips.json")):
        found += [Flip.from_json(f | {"run_id": path.parent.name}) for f in json.loads(path.read_text())]
    return found
