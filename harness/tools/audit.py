"""`compat-matrix audit`: a lockfile and a setup in, the known failures that apply out, as a CI gate (pip-audit's
conventions: `--format columns|json|markdown`, `--ignore-id`, exit 1 when an advisory applies, 0 when none does, 2 on
bad input). It is a view of the one judge (`knowledge/judge.py`), over the tables written beside the advisories.

It reads what the user has (`requirements.txt` with exact pins or a `pip freeze`, `uv.lock`, `pylock.toml`,
`poetry.lock`, or an environment: this one with `--env`, another with `--python`) and their setup (the YAML that
`accelerate config` writes, a DeepSpeed JSON, or `--setup fsdp1,lora`), asks the judge about every known failure, and
prints each answer that concerns the user: APPLIES (exit 1), APPLIES IF (a condition on their model no lockfile shows:
exit 1 only under `--strict`), RANGE (a range they allow admits a release measured failing), UNDECIDED (their releases
lie where nothing was measured: never clean; with the command that measures them), PITFALL (their setup fails on every
release measured) and CLEARED (their setup already has the measured fix), each with how sure it is. Then the one
recommended set of pins (`knowledge/ways_out.py`): the fewest release moves that leave nothing applying, judged again
over every failure, and per failure what one move of each of its packages ends and brings.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from harness.errors import UsageError
from harness.knowledge.judge import Query, evaluate, fix_answers
from harness.knowledge.ways_out import way_out
from harness.paths import MEASURED_FOLDER, RESULTS_DIR
from harness.publishing.advisories import JUDGE_FILE, read_tables
from harness.tools.user_files import (
    Pins,
    environment_pins,
    loose_ranges,
    read_pins,
    read_setup,
    read_text,
    requirement_name,
)

FORMATS = ("columns", "json", "markdown")


# --- judging -------------------------------------------------------------------------------------------------------

#: What each state is called in the columns.
LABELS = {"applies": "APPLIES", "applies-if": "APPLIES IF", "range": "RANGE", "undecided": "UNDECIDED",
          "pitfall": "PITFALL", "cleared": "CLEARED"}  # fmt: skip
SHOWN = tuple(LABELS)


@dataclass
class Report:
    """The judge's answers that concern the user (`answers`; `every` answer for the way out), the tables they came
    from, and the one recommended way out, searched when it is first asked for."""

    answers: list[dict[str, Any]]
    tables: dict[str, Any]
    query: Query
    every: list[dict[str, Any]] = field(default_factory=list)
    loose: list[str] = field(default_factory=list)
    #: The requirements files read (a way out is printed as a diff of one; none for lockfiles and environments).
    requirements: list[Path] = field(default_factory=list)
    #: Print the way out in full (a requirements diff and the install lines), as `--fix` asks.
    fix: bool = False
    _fixes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @cached_property
    def way_out(self) -> dict[str, Any]:
        return way_out(self.tables, self.query, self.every)

    def failure(self, failure_id: str) -> dict[str, Any]:
        return next(f for f in self.tables["failures"] if f["id"] == failure_id)

    def fixes(self, failure_id: str) -> list[dict[str, Any]]:
        """The failure's measured fixes, each judged at the user's releases, setup and GPU count (most sure first),
        with the command that measures it here where it was not."""
        if failure_id not in self._fixes:
            failure = self.failure(failure_id)
            judged = fix_answers(self.tables, failure, self.query)
            for fix in judged:
                if fix["state"] == "unmeasured":
                    fix["measure"] = measure_argv(failure, self.query)
            self._fixes[failure_id] = judged
        return self._fixes[failure_id]

    def gate(self, strict: bool = False) -> int:
        """pip-audit's exit code: 1 where a failure applies (or applies if, under --strict), else 0."""
        failing = ("applies", "applies-if") if strict else ("applies",)
        return 1 if any(a["state"] in failing for a in self.answers) else 0


#: Where a wheel install (a pre-commit hook, a CI job's `pip install`) keeps the advisories of the commit it was built
#: from (pyproject's force-include); a checkout reads results/advisories.
PACKAGED = Path(__file__).resolve().parents[1] / "advisories_feed"


def load_tables(results_dir: Path) -> dict[str, Any]:
    """The judge's tables written with the advisories (a checkout's, else the ones packaged in the wheel)."""
    folder = results_dir / "advisories"
    if not (folder / JUDGE_FILE).is_file() and results_dir == RESULTS_DIR and (PACKAGED / JUDGE_FILE).is_file():
        folder = PACKAGED
    if not (folder / JUDGE_FILE).is_file():
        raise UsageError(f"no {folder / JUDGE_FILE}: run `nox -s report` first")
    if measured_since(results_dir, (folder / JUDGE_FILE).stat().st_mtime):
        return tables_from_records(results_dir)
    return read_tables(folder)


def measured_since(results_dir: Path, when: float) -> bool:
    """Whether a run was measured here (`lookup --measure`, `audit --fix --measure`) after the tables were written:
    then the judge reads the records themselves, so the next audit of those pins answers from that run."""
    return any(p.stat().st_mtime > when for p in (results_dir / MEASURED_FOLDER).glob("*/runs/*/records.jsonl"))


def tables_from_records(results_dir: Path) -> dict[str, Any]:
    from harness.define.registry import discover
    from harness.knowledge.atlas import Atlas

    return Atlas(results_dir, {s.id: s.spec for s in discover()}).tables


def audit(tables: dict[str, Any], query: Query) -> Report:
    """The judge's answers for the query (those that concern the user) and the way out over all of them."""
    answers = evaluate(tables, query)
    return Report([a for a in answers if a["state"] in SHOWN], tables, query, answers)


def query_of(
    tables: dict[str, Any],
    pins: dict[str, str],
    setup: dict[str, str],
    loose: list[str],
    partial: bool,
    gpus: int | None,
    device: str | None,
    ignore: list[str],
) -> Query:
    """The judge's question: the pins, the releases the atlas measured that each loose requirement admits, the setup,
    and where it trains (`--gpus 0` is a CPU run; N GPUs a GPU run; `--device` says it without a count)."""
    ranges = {}
    for package, specifier in loose_ranges(loose).items():
        ranges[package] = [v for v in tables["releases"].get(package, []) if specifier.contains(v)]
    where = device or ("cpu" if gpus == 0 else "cuda" if gpus else None)
    return Query(dict(pins), dict(setup), where, gpus, partial, [], ranges, list(ignore))


# --- output --------------------------------------------------------------------------------------------------------


def render(report: Report, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(as_json(report), indent=1)
    if fmt == "markdown":
        return markdown(report)
    return "\n".join(columns(report))


def as_json(report: Report) -> dict[str, Any]:
    """Structured, for tools: each answer with its failure's packages, affected segments, fixed-in releases, setups,
    how sure, the evidence, and the one way out."""
    found = []
    for answer in report.answers:
        entry = {k: answer.get(k) for k in ("id", "scenario", "device", "state", "why", "sure", "when")}
        if answer["state"] != "pitfall":
            failure = report.failure(answer["id"])
            entry |= {
                "summary": _summary(failure),
                "packages": failure["conditions"],
                "fixed_in": {
                    p: [e["release"] for e in events if e["kind"] == "fixed"] for p, events in failure["events"].items()
                },
                "affected": {
                    p: [s for s in failure["segments"][p] if s[4] == "affected"] for p in failure["conditions"]
                },
                "setups": [s["words"] for s in failure["setups"]],
                "applies_if": failure["detail"],
                "fixes": report.fixes(answer["id"]),
                "evidence": answer.get("evidence") or [],
                "measure": measure_command(failure, report.query),
            }
        else:
            entry |= {"way_out": answer.get("way_out")}
        found.append(entry)
    pins = report.way_out.get("pins") or {}
    install = dict(zip(("uv", "pip"), install_lines(pins), strict=True)) if pins else {}
    if pins:
        install["diff"] = [line[2:] for line in _diff(report, pins)]
    return {"answers": found, "way_out": report.way_out | {"install": install}, "totals": _totals(report),
            "not_judged": report.loose}  # fmt: skip


def _summary(failure: dict[str, Any]) -> str:
    where = "on GPUs" if failure["device"] == "cuda" else "on CPU"
    return f"{failure['scenario']}: {failure['title']} ({where})"


def _totals(report: Report) -> dict[str, int]:
    return {state: sum(1 for a in report.answers if a["state"] == state) for state in SHOWN}


def totals_line(report: Report) -> str:
    counts = _totals(report)
    said = [f"{n} {LABELS[s].lower()}" for s, n in counts.items() if n]
    return "; ".join(said) if said else "no known failure concerns these releases and this setup"


def columns(report: Report) -> list[str]:
    lines = []
    for group in _grouped(report.answers):
        answer = group[0]
        if len(group) == 1:
            lines.append(f"{LABELS[answer['state']]:10} {answer['id']}  {_title(report, answer)}")
        else:  # several failures of one scenario undecided for one reason: said once
            lines.append(f"{LABELS[answer['state']]:10} {len(group)} failures of {_title(report, answer)}: "
                         + ", ".join(a["id"] for a in group))  # fmt: skip
        lines += [f"           {line}" for line in _answer_lines(report, answer)]
    if report.loose:
        lines.append(f"not pinned exactly (judged by the releases the atlas measured in their range): "
                     f"{', '.join(report.loose)}")  # fmt: skip
    lines += way_out_lines(report)
    lines.append(totals_line(report))
    return lines


def _grouped(answers: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The answers in order, undecided ones of one scenario, device and reason together."""
    groups: list[list[dict[str, Any]]] = []
    for answer in answers:
        last = groups[-1][0] if groups else None
        same = ("scenario", "device", "state", "why", "sure")
        if last is not None and answer["state"] == "undecided" and all(last[k] == answer[k] for k in same):
            groups[-1].append(answer)
        else:
            groups.append([answer])
    return groups


def _title(report: Report, answer: dict[str, Any]) -> str:
    if answer["state"] == "pitfall":
        where = "on GPUs" if answer["device"] == "cuda" else "on CPU"
        return f"{answer['scenario']}: a pitfall of {answer['when']} ({where})"
    return _summary(report.failure(answer["id"]))


def _answer_lines(report: Report, answer: dict[str, Any]) -> list[str]:
    state = answer["state"]
    if state == "pitfall":
        return [f"why: {answer['why']}", f"way out: {', '.join(answer.get('way_out') or [])}"]
    failure = report.failure(answer["id"])
    lines = [f"when: {answer.get('when') or 'any setup'}"]
    if state == "applies-if":
        lines.append(f"applies if: {failure['detail']}")
    lines.append(f"{'because' if state in ('undecided', 'cleared') else 'you have'}: {answer['why']}")
    if state != "cleared":
        lines.append(f"how sure: {SURE_WORDS.get(answer['sure'], answer['sure'])}")
    if state in ("undecided", "range"):
        lines.append(f"measure it: {measure_command(failure, report.query)}")
    if state in ("applies", "applies-if"):
        lines += [f"way out: {n}" for n in note_lines(report, answer["id"])]
        lines += fix_lines(report, answer["id"])
    return lines


#: What a fix is at the user's releases, setup and GPU count, in words.
FIX_STATE_WORDS = {"fixes": "fixes it here", "does-not-fix": "does not fix it here: it fails the same way",
                   "brings": "ends it here and brings", "unmeasured": "not measured here"}  # fmt: skip
FIX_SURE_WORDS = {"exact": "a record at these releases", "bracketed": "bracketed by the releases measured around yours"}
#: How many fixes an answer lists in the columns (every one is in --format json).
SHOWN_FIXES = 3


def fix_words(fix: dict[str, Any]) -> str:
    """'FSDP: FSDP2 instead of FSDP1: fixes it here (a record at these releases)'; an unmeasured one says where it
    was measured instead."""
    said = FIX_STATE_WORDS[fix["state"]] + (f" {', '.join(fix['brings'])}" if fix["state"] == "brings" else "")
    if fix["state"] == "unmeasured":
        return f"{fix['words']}: {said} ({fix['why']}; {fix['where'] or 'measured nowhere else'})"
    return f"{fix['words']}: {said} ({FIX_SURE_WORDS[fix['sure']]})"


def fix_lines(report: Report, failure_id: str, indent: str = "") -> list[str]:
    """Each fix of the failure judged at the user's releases, most sure first; the command that measures the ones not
    measured here."""
    fixes = report.fixes(failure_id)
    lines = [f"{indent}{f['kind']}: {fix_words(f)}" for f in fixes[:SHOWN_FIXES]]
    if len(fixes) > SHOWN_FIXES:
        lines.append(f"{indent}{len(fixes) - SHOWN_FIXES} more fixes judged in --format json")
    if any(f["state"] == "unmeasured" for f in fixes[:SHOWN_FIXES]):
        lines.append(f"{indent}measure the fixes here: {measure_command(report.failure(failure_id), report.query)}")
    return lines


SURE_WORDS = {
    "exact": "records at exactly these releases of every package it depends on, this setup",
    "bracketed": "not measured at these exact releases; the releases measured around them decide it",
    "unmeasured": "not measured here",
}


def note_lines(report: Report, failure_id: str) -> list[str]:
    """What one move of each of the failure's packages does: 'upgrade peft to 0.21.0: ends it; brings S7 ...'."""
    lines = []
    stays = failure_id in report.way_out.get("stays", [])
    for note in report.way_out.get("notes", {}).get(failure_id, []):
        if not note.get("release"):
            lines.append(note.get("why", "") + (": a fix of the setup below" if stays else ""))
            continue
        verb = "upgrade" if note["direction"] == "upgrade" else "pin"
        brings = [f"{i} ({report.failure(i)['scenario']})" for i in note["brings"] if i != failure_id]
        along = note.get("along") or {}
        needs = f" with {', '.join(f'{p} {v}' for p, v in along.items())} (what it declares it needs)" if along else ""
        lines.append(f"{verb} {note['package']} to {note['release']}{needs} (measured): ends it"
                     + (f"; brings {', '.join(brings)}" if brings else ""))  # fmt: skip
    if stays and not lines:
        lines.append("no measured release ends it: a fix of the setup below")
    return lines


def way_out_lines(report: Report) -> list[str]:
    """The one recommended set of pins: one line, or under `--fix` as a requirements diff (a unified diff of the user's
    requirements file where one was read) and the install lines."""
    found = report.way_out
    if not found.get("pins"):
        return [f"way out: {found['none']}"] if found.get("none") else []
    pins = found["pins"]
    if not report.fix:
        lines = ["recommended pins (each release measured; judged again over every known failure): "
                 + " ".join(f"{p}=={v}" for p, v in pins.items())
                 + " (--fix: as a diff and install lines; --fix --measure: proven by a run here)"]  # fmt: skip
    else:
        lines = ["recommended pins (each release measured; judged again over every known failure):"]
        lines += _diff(report, pins) or [
            *(f"  - {p}=={found['from'][p]}" if found["from"].get(p) else f"  - {p} (not pinned)" for p in pins),
            *(f"  + {p}=={v}" for p, v in pins.items()),
        ]
        lines += [f"  {line}" for line in install_lines(pins)]
    if found.get("still"):
        lines.append(f"  it leaves applying: {', '.join(found['still'])} ({found['none']})")
    if found.get("brings"):
        lines.append(f"  it brings (applies at these pins, not at yours): {', '.join(found['brings'])}"
                     + ("" if found.get("still") else f" ({found['none']})"))  # fmt: skip
    if found.get("leaves"):
        lines.append(f"  it leaves undecided (not measured there): {len(found['leaves'])} failure(s)")
    return lines


def install_lines(pins: dict[str, str]) -> tuple[str, str]:
    """The `uv add` and `pip install` lines that move to the pins."""
    quoted = " ".join(f"'{p}=={v}'" for p, v in pins.items())
    return f"uv add {quoted}", f"pip install {quoted}"


def _diff(report: Report, pins: dict[str, str]) -> list[str]:
    """A unified diff of the requirements file that pins the moved packages (empty where none was read: a lockfile
    is changed by `uv add`, not by hand)."""
    if not report.requirements:
        return []
    naming = [p for p in report.requirements if set(pins) & set(map(requirement_name, read_text(p).splitlines()))]
    source = (naming or report.requirements)[0]
    before = read_text(source).splitlines()
    after, done = [], set()
    for line in before:
        name = requirement_name(line)
        if name in pins:
            after.append(f"{name}=={pins[name]}")
            done.add(name)
        else:
            after.append(line)
    after += [f"{p}=={v}" for p, v in pins.items() if p not in done]
    diff = difflib.unified_diff(before, after, str(source), str(source), lineterm="", n=1)
    return [f"  {line}" for line in diff]


def markdown(report: Report) -> str:
    lines = ["| advisory | state | what | setups | how sure | way out |", "|---|---|---|---|---|---|"]
    for answer in report.answers:
        link = (
            f"[{answer['id']}](results/advisories/{answer['id']}.json)"
            if answer["state"] != "pitfall"
            else answer["id"]
        )
        way = (
            "; ".join(note_lines(report, answer["id"]))
            if answer["state"] != "pitfall"
            else ", ".join(answer.get("way_out") or [])
        )
        lines.append(f"| {link} | {LABELS[answer['state']]} | {_title(report, answer)} | {answer.get('when') or ''} | "
                     f"{answer['sure'] or '-'} | {way or answer['why']} |")  # fmt: skip
    lines += ["", *[line.lstrip() for line in way_out_lines(report)], "", f"**{totals_line(report)}**"]
    return "\n".join(lines)


def measure_argv(failure: dict[str, Any], query: Query) -> dict[str, Any]:
    """The command that measures the user's own releases for this failure (its baseline and every fix), as an argv and
    where to run it: `lookup --measure` here on CPU; on GPUs, `check` inside the user's environment on their GPUs."""
    if failure["device"] == "cuda" or query.device == "cuda":
        gpus = query.gpus or max(failure["world_sizes"] or [1])
        return {"argv": ["compat-matrix", "check", "--scenario", failure["scenario"]],
                "where": f"in that environment on {gpus} GPU(s)"}  # fmt: skip
    asked = [f"{p}=={query.versions[p]}" for p in failure["depends"] if p in query.versions]
    setup = ",".join(v for k, v in query.setup.items() if k in ("engine", "adapter", "loop", "state_dict"))
    argv = ["compat-matrix", "lookup", *asked, "--scenario", failure["scenario"]]
    return {"argv": argv + (["--setup", setup] if setup else []) + ["--measure"], "where": "here, on CPU"}


def measure_command(failure: dict[str, Any], query: Query) -> str:
    """`measure_argv` in words: '`compat-matrix lookup ... --measure`', or on GPUs where to run `check`."""
    found = measure_argv(failure, query)
    line = f"`{' '.join(found['argv'])}`"
    return line if found["where"] == "here, on CPU" else f"{found['where']}: {line}"


def command(args: Any) -> Report:
    """Read the user's files, judge, print the answer; the report (its `gate` is the exit code)."""
    if sum(bool(x) for x in (args.files, args.env, args.python)) != 1:
        raise UsageError("give one of: lockfiles or requirements files, --env, or --python PATH")
    if args.gpus is not None and args.gpus < 0:
        raise UsageError(f"--gpus {args.gpus}: give 0 (a CPU run) or how many GPUs you train on")
    if args.measure and not args.fix:
        raise UsageError("--measure proves the way out --fix prints: give --fix --measure")
    found = Pins()
    if args.files:
        for path in args.files:
            more = read_pins(Path(path))
            found.pins |= more.pins
            found.loose += more.loose
            found.partial = found.partial or more.partial
            found.requirements += more.requirements
    else:
        found.pins = environment_pins(args.python)
    user = read_setup(args.accelerate_config, args.deepspeed_config, args.setup or [], args.trainer_config, found.pins)
    gpus = args.gpus if args.gpus is not None else user.gpus
    tables = load_tables(args.results_dir)
    query = query_of(
        tables, found.pins, user.setup, found.loose, found.partial, gpus, args.device, args.ignore_id or []
    )
    report = audit(tables, query)
    report.loose, report.requirements, report.fix = found.loose, found.requirements, args.fix
    print(render(report, args.format))
    return report
