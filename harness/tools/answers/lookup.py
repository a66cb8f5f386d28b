"""`compat-matrix lookup transformers==4.46.3 --scenario S9-identity-grad-accumulation`: what the atlas knows about a
user's releases, per scenario and known failure, with the way out. A view of the one judge (`knowledge/judge.py`):

- per scenario, the records at exactly these releases of every package it depends on (the table's install days,
  the probes of flips, sweeps and bisects, the release watch, an earlier `--measure`): how many of their configs show
  its target, and where they ran;
- per known failure of the scenario that concerns the user, the judge's answer (applies, applies if, undecided,
  pitfall, cleared) and how sure it is: exact, bracketed (the releases around them were measured) or unmeasured;
- the way out judged over every known failure (`knowledge/ways_out.py`), and what one move of each package does.

A version given as `2.4` names every 2.4.x release (a prefix on release components). Without `--device`, a question
about scenarios that run on CPU is answered from CPU records. `--measure` builds the asked releases here when no record
holds them and answers from that run.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from harness.define import setup as vocabulary
from harness.define.packages import AXIS_PACKAGES
from harness.errors import UsageError
from harness.knowledge.atlas import Atlas
from harness.knowledge.evidence import depends_of
from harness.knowledge.failures import Observation
from harness.knowledge.judge import Query
from harness.tools.answers.audit import SURE_WORDS, Report, fix_lines, measure_command, note_lines, way_out_lines

#: The answers a lookup shows (clean and not applicable ones are summed up in one line).
SHOWN = ("applies", "applies-if", "range", "undecided", "pitfall", "cleared")
WORDS = {"applies": "APPLIES", "applies-if": "APPLIES IF", "range": "RANGE", "undecided": "UNDECIDED",
         "pitfall": "PITFALL", "cleared": "CLEARED"}  # fmt: skip


def parse_query(items: list[str]) -> dict[str, str]:
    """'torch==2.4' -> {'torch': '2.4'}; bad input is a usage error naming the item."""
    wanted: dict[str, str] = {}
    for item in items:
        name, sep, version = item.partition("==")
        name = canonicalize_name(name.strip())
        if not sep or name not in AXIS_PACKAGES:
            raise UsageError(f"{item!r}: expected PACKAGE==VERSION with PACKAGE one of {', '.join(AXIS_PACKAGES)}")
        try:
            Version(version)
        except InvalidVersion:
            raise UsageError(f"{item!r}: {version!r} is not a version") from None
        wanted[name] = version.strip()
    if not wanted:
        raise UsageError("give at least one PACKAGE==VERSION")
    return wanted


def query_of(wanted: dict[str, str], setup: dict[str, str], device: str | None, gpus: int | None) -> Query:
    """A version of fewer than three parts is a prefix ('2.4' names every 2.4.x); '2.4.1' is that release."""
    where = device or ("cpu" if gpus == 0 else "cuda" if gpus else None)
    prefix = [p for p, v in wanted.items() if len(Version(v).release) < 3]
    return Query(dict(wanted), dict(setup), where, gpus, partial=True, prefix=prefix)


def observed_at(atlas: Atlas, scenario: str, query: Query) -> list[Observation]:
    """The observations of a scenario at exactly the asked releases of every package its config depends on (a
    package not asked about is not narrowed), of the asked setup and device."""
    spec = atlas.specs.get(scenario)
    found = []
    for obs in atlas.observations:
        if obs.scenario != scenario or (query.device and obs.device != query.device):
            continue
        setup = dict(obs.setup)
        if not vocabulary.agrees(setup, query.setup):
            continue
        stack = dict(obs.stack)
        depends = depends_of(spec, setup)
        if all(_matches(stack.get(p), v) for p, v in query.versions.items() if p in depends):
            found.append(obs)
    return found


def _matches(have: str | None, want: str) -> bool:
    from harness.knowledge.judge import _matches as judge_matches

    return judge_matches(have, want, True)


def lookup(
    results_dir: Path,
    items: list[str],
    scenarios: list[str] | None,
    device: str | None,
    setup: list[str] | None = None,
    measure: bool = False,
    gpus: int | None = None,
) -> str:
    """The answer for `items` (PACKAGE==VERSION); with `measure`, where no record holds them, the stack built and the
    scenarios run here first (`answers/measure.py`), then the answer."""
    from harness.define.registry import discover, select

    wanted = parse_query(items)
    known = select(scenarios, where="--scenario") if scenarios else discover()
    asked = [s.id for s in known]
    if measure and (not scenarios or device == "cuda"):
        raise UsageError("--measure runs here on CPU: name the scenarios to run with --scenario (and no --device cuda)")
    atlas = Atlas(results_dir, {s.id: s.spec for s in discover()})
    if not atlas.selection.run_ids:
        raise UsageError(f"no records under {atlas.store.runs_root}")
    if device is None and gpus is None and all(atlas.specs[s].get("device", "any") != "cuda" for s in asked):
        device = "cpu"  # a question about scenarios that run on CPU: answered from CPU records
    query = query_of(wanted, vocabulary.parse_words(setup or []), device, gpus)
    lines = []
    if measure and not any(observed_at(atlas, s, query) for s in asked):
        from harness.tools.answers.measure import measure as measure_here

        run_dir = measure_here(results_dir, atlas.days("cpu"), wanted, asked)
        lines.append(f"recorded: {run_dir}\n")
        atlas = Atlas(results_dir, atlas.specs)
    return "\n".join([*lines, render(atlas, query, asked, items)])


def render(atlas: Atlas, query: Query, scenarios: list[str], items: list[str] | None = None) -> str:
    """The terminal answer: what was asked, per scenario the records at exactly these releases and each known failure's
    answer, then the way out over all of them."""
    answers = atlas.judge(query)
    report = Report(answers, atlas.tables, query, answers, fix=True)
    where = query.device or "any device"
    lines = [
        "asked: " + ", ".join(f"{p} {v}" for p, v in query.versions.items())
        + f" ({where}; {vocabulary.words(query.setup) if query.setup else 'any setup'})"
        + (f"; {', '.join(query.prefix)} given as a prefix: 2.4 names every 2.4.x release" if query.prefix else "")
    ]  # fmt: skip
    unmeasured = False
    for scenario in scenarios:
        mine = [a for a in answers if a["scenario"] == scenario]
        observed = observed_at(atlas, scenario, query)
        measured_here = any(o.scenario == scenario and query.device in (None, o.device) for o in atlas.observations)
        if not observed and not measured_here and not any(a["state"] in SHOWN for a in mine):
            continue  # a scenario this device never ran: nothing to say of it
        lines.append("")
        lines += scenario_lines(atlas, report, scenario, observed, mine)
        unmeasured |= not observed or any(a["sure"] == "unmeasured" for a in mine if a["state"] in SHOWN)
    if len(lines) == 1:
        lines.append("\nno record of these scenarios at these releases, and no known failure of theirs concerns them")
    shown = {a["id"] for a in answers if a["state"] in SHOWN}
    if shown & set(report.way_out.get("ends", []) + report.way_out.get("still", [])):
        lines += ["", "for every known failure that applies to these releases (any scenario):", *way_out_lines(report)]
    if unmeasured and items and query.device != "cuda":
        lines.append(f"\nto measure these releases here: compat-matrix lookup {' '.join(items)} --measure"
                     + "".join(f" --scenario {s}" for s in scenarios[:3]))  # fmt: skip
    return "\n".join(lines)


def scenario_lines(
    atlas: Atlas, report: Report, scenario: str, observed: list[Observation], answers: list[dict[str, Any]]
) -> list[str]:
    """One scenario: its records at these releases, then each known failure's answer that concerns the user."""
    spec = atlas.specs.get(scenario) or {}
    title = str(spec.get("title") or "").split(": ", 1)[0]
    lines = [f"{scenario}: {title}"]
    pitfalls = {(p.scenario, p.device, p.config_id) for p in atlas.pitfalls.values()}
    lines.append("  " + records_line(observed, spec, pitfalls))
    for answer in (a for a in answers if a["state"] in SHOWN):
        lines += answer_lines(report, answer)
    clean = [a for a in answers if a["state"] == "clean"]
    for answer in (a for a in clean if a["sure"] == "exact"):  # a measured answer is shown whatever else applies
        failure = report.failure(answer["id"])
        lines.append(f"  CLEAN (exact): {answer.get('when') or 'any setup'} [{failure['failure']}] ({answer['id']})")
        lines.append(f"    why: {answer['why']}")
    bracketed = [a for a in clean if a["sure"] != "exact"]
    if not any(a["state"] in SHOWN for a in answers):
        lines.append("  no known failure of this scenario applies here"
                     + (f" ({len(clean)} measured clean)" if clean else ""))  # fmt: skip
    elif bracketed:
        lines.append(f"  clean, bracketed by the releases measured around these: {len(bracketed)} known failure(s)")
    return lines


def records_line(observed: list[Observation], spec: dict[str, Any], pitfalls: set[tuple[str, str, str]]) -> str:
    """'at these releases: the target shows on 3 of 4 configs (the Trainer · LoRA: 2; ...) in era_date-...'; a pitfall
    config (it fails on every release) is counted apart."""
    if not observed:
        return "at these releases: no record (the answers below are bracketed by the releases measured around them)"
    apart = {o.config_id for o in observed if (o.scenario, o.device, o.config_id) in pitfalls}
    per_config: dict[str, Observation] = {}
    for obs in (o for o in observed if o.config_id not in apart):
        if obs.config_id not in per_config or obs.outcome == "fail":
            per_config[obs.config_id] = obs
    target = list(spec.get("target") or [])
    shows = [o for o in per_config.values() if o.outcome == "fail" and _is_target(o.signature, target)]
    others = [o for o in per_config.values() if o.outcome == "fail" and o not in shows]
    setups = Counter(vocabulary.words(dict(o.setup)) for o in shows)
    cells = [c for _, c in sorted({(o.source != "table", o.cell) for o in observed})]
    text = f"at these releases: the target shows on {len(shows)} of {len(per_config)} configs"
    if setups:
        text += " (" + "; ".join(f"{w}: {n}" for w, n in sorted(setups.items())) + ")"
    if others:
        text += f"; {len(others)} failed another way ({', '.join(sorted({str(o.signature) for o in others}))})"
    if apart:
        text += f"; {len(apart)} pitfall config{'s' if len(apart) > 1 else ''} apart (fail on every release)"
    return text + f"; records in {', '.join(cells[:2])}" + (f" and {len(cells) - 2} more" if len(cells) > 2 else "")


def _is_target(signature: str | None, target: list[str]) -> bool:
    from harness.recording.verdicts import matches

    return matches(signature, target)


def answer_lines(report: Report, answer: dict[str, Any]) -> list[str]:
    """A known failure's answer: its state, how sure, its setups and why; the way out where it applies."""
    state = answer["state"]
    head = f"  {WORDS[state]}"
    if state == "pitfall":
        return [f"{head}: {answer['when']}: a pitfall, not a version failure: {answer['why']}",
                f"    way out: {', '.join(answer.get('way_out') or [])}"]  # fmt: skip
    failure = report.failure(answer["id"])
    condition = f" {failure['detail']}" if state == "applies-if" else ""
    lines = [f"{head}{condition} ({answer['sure'] or 'measured'}): {answer.get('when') or 'any setup'} "
             f"[{failure['failure']}] ({answer['id']})"]  # fmt: skip
    lines.append(f"    {'because' if state in ('undecided', 'cleared') else 'why'}: {answer['why']}")
    if answer["sure"] and state != "cleared":
        lines.append(f"    how sure: {SURE_WORDS.get(answer['sure'], answer['sure'])}")
    if state in ("undecided", "range"):
        lines.append(f"    measure it: {measure_command(failure, report.query)}")
    if state in ("applies", "applies-if"):
        lines += [f"    way out: {line}" for line in note_lines(report, answer["id"])]
        lines += fix_lines(report, answer["id"], indent="    ")
    return lines
