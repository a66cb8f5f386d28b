"""Build results/COMPATIBILITY.md from records: rows are cells, columns are scenarios.

Every entry is derived from records; nothing is typed in by hand. An entry shows the baseline outcome
with its signature, and which fixes turn it green across the configs where the baseline failed.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.define.packages import AXIS_PACKAGES
from harness.publishing.glance import fullest_versions, glance_markdown, scenario_anchor
from harness.recording import runs
from harness.recording.outcomes import UNSIGNED
from harness.recording.records import read_records, record_key
from harness.recording.signatures import RULES_DIGEST, rename_all
from harness.recording.verdicts import headline, short_reason, verdict
from harness.textsafe import code, md

LEGEND = """\
- Each scenario exists for one failure mode, its **target** (named in its file). **FAIL target `signature` (k/n)**:
  the baseline showed the target on k of the n configs that can show it (controls and skipped configs are not
  among the n). **target not reproduced (0/n)**: it did not. A scenario without a target (a measurement, S3)
  shows **FAIL `signature` (k/n)** or **not reproduced (n)** over all its failures.
- **fixed by**: variants that passed on every config where the baseline showed the target; **partly**: on some;
  **not fixed by**: on none (what they got instead in brackets); **not applicable here**: they could not run.
  A variant marked **(workaround)** changes the setup (another ZeRO stage, other dtypes, another FSDP version)
  at a cost; the others are fixes a user adds to the same setup. Each variant's one-line description is in the
  site and in the scenario's file.
- **other failures**: failures of the baseline that are not the target, with their own counts: findings, not
  noise, never part of the target's count. **controls**: configs expected to pass (e.g. the LoRA twin of a DoRA
  config). **ran**: device, world size and the FSDP version that really ran.
- **SKIP**: the scenario cannot run in this cell (reason in the per-scenario section).
  **INSTALL-FAILED**: the cell's pins could not be installed. **ENV-BROKEN**: the stack does not import.
- **FLAKY**: a retry disagreed with the first attempt (the record's `attempts` list them); never counted as pass.
- **TIMEOUT / CRASH / ERROR**: the run hung, died, or hit a bug in the harness or scenario (never hidden).
- Failure names are given when the table is made (section "Failure names").
- Metrics in per-scenario tables are medians over configs.
"""


@dataclass(frozen=True)
class Selection:
    run_ids: list[str]
    records: list[dict[str, Any]]
    metas: list[dict[str, Any]]
    #: Keys whose outcome in an older run of the same profile differs from the one shown: marked flaky.
    conflicting: frozenset[tuple[str, ...]] = frozenset()
    #: The records of the probe runs (flips' moves and sweeps, bisects, the watch) beside the table's: evidence at
    #: exact releases (a config that passed in one is no pitfall). Read for the default table only.
    probes: tuple[dict[str, Any], ...] = ()

    def pitfalls(self, specs: dict[str, dict[str, Any]]) -> dict[tuple[str, str], Any]:
        """The configs that fail on every release measured (`knowledge.pitfalls`), from the table and the probes."""
        from harness.publishing.knowledge import pitfalls

        return pitfalls(self.latest()[0], specs, self.probes)

    def latest(self) -> tuple[list[dict[str, Any]], set[tuple[str, ...]]]:
        records, flaky = latest_by_key(self.records)
        return records, flaky | set(self.conflicting)


def select_runs(results_dir: Path, run_ids: Iterable[str] | None = None) -> Selection:
    """The named runs (all their records), or by default the newest evidence per profile and GPU count
    (`evidence_group`): runs of a group newest first, each contributing the (cell, scenario) pairs no newer run of
    that group covers. A run that re-checks one scenario on one cell then updates that entry without hiding the
    rest. Retired runs (`retired`) are left out."""
    run_root = results_dir / "runs"
    metas = {d.name: _shown_meta(d) for d in sorted(run_root.glob("*")) if (d / "meta.json").is_file()}
    if run_ids:
        chosen = list(run_ids)
        unknown = [r for r in chosen if r not in metas]
        if unknown:
            from harness.errors import UsageError

            raise UsageError(f"unknown run id(s): {', '.join(unknown)} (known: {', '.join(metas) or 'none'})")
        records = [rec for r in chosen for rec in rename_all(read_records(run_root / r / "records.jsonl"))]
        return Selection(chosen, qualify_shared_cells(records, metas), [metas[r] for r in chosen])
    by_profile: dict[str, list[str]] = defaultdict(list)
    for run_id, meta in metas.items():
        if not retired(meta):
            by_profile[evidence_group(run_id, metas)].append(run_id)
    chosen, records = [], []
    disagreeing: set[tuple[str, tuple[str, ...]]] = set()
    for profile in sorted(by_profile):
        shown: dict[tuple[str, ...], str] = {}
        shown_by: dict[tuple[str, ...], Evidence] = {}
        newest_first = sorted(by_profile[profile], key=lambda r: metas[r].get("started_at", ""), reverse=True)
        runs = ((r, rename_all(read_records(run_root / r / "records.jsonl"))) for r in newest_first)
        for run_id, fresh, hidden in newest_per_pair(runs, config_slices(metas)):
            for rec in hidden:
                if record_key(rec) in shown and shown[record_key(rec)] != rec["outcome"]:
                    if same_code((metas[run_id], rec), shown_by[record_key(rec)]):
                        disagreeing.add((profile, record_key(rec)))  # an older run disagrees: flaky, never hidden
            if fresh:
                chosen.append(run_id)
                records.extend(fresh)
                shown |= {record_key(rec): rec["outcome"] for rec in fresh}
                shown_by |= {record_key(rec): (metas[run_id], rec) for rec in fresh}
    chosen.sort()
    shared = shared_cells(records, metas)
    records = qualify_shared_cells(records, metas, shared)
    # A flaky key of a shared cell follows its cell to the qualified id.
    conflicting = {(_shown_cell(key[0], profile, shared), *key[1:]) for profile, key in disagreeing}
    from harness.publishing.knowledge import probe_records

    return Selection(
        chosen, records, [metas[r] for r in chosen], frozenset(conflicting), tuple(probe_records(results_dir))
    )


def newest_per_pair(
    runs: Iterable[tuple[str, list[dict[str, Any]]]],
    config_slices: frozenset[str] = frozenset(),
) -> Iterator[tuple[str, list[dict[str, Any]], list[dict[str, Any]]]]:
    """(run id, fresh, hidden) for runs given newest first: a run gives the (cell, scenario) pairs no newer run
    covers (fresh); its records of pairs a newer run covers are hidden. A run that re-checks one scenario on one
    cell updates that entry without hiding the rest, and a run of `config_slices` (made with `--config`) covers only
    the configs it ran: a new config on every day never hides the configs the days ran before."""
    covered: set[tuple[str, ...]] = set()

    def hidden_by_newer(record: dict[str, Any]) -> bool:
        pair = (record["cell"], record["scenario"])
        return pair in covered or (*pair, str(record.get("config_id"))) in covered

    for run_id, run_records in runs:
        fresh = [r for r in run_records if not hidden_by_newer(r)]
        hidden = [r for r in run_records if hidden_by_newer(r)]
        if run_id in config_slices:
            covered |= {(r["cell"], r["scenario"], str(r.get("config_id"))) for r in fresh}
        else:
            covered |= {(r["cell"], r["scenario"]) for r in fresh}
        yield run_id, fresh, hidden


def config_slices(metas: dict[str, dict[str, Any]]) -> frozenset[str]:
    """Runs every attempt of which ran only chosen configs (`matrix --config`): evidence of those configs only."""
    return frozenset(
        run_id
        for run_id, meta in metas.items()
        if meta.get("attempts") and all((a.get("slice") or {}).get("config_ids") for a in meta["attempts"])
    )


def retired(meta: dict[str, Any]) -> bool:
    """A run that is no evidence any more: `superseded_by` (newer runs measured the same again) or `withdrawn` (its
    method was found wrong and nothing re-measured it; the reason stays in its meta.json and NOTES)."""
    return bool(meta.get("superseded_by") or meta.get("withdrawn"))


def evidence_group(run_id: str, metas: dict[str, dict[str, Any]]) -> str:
    """What a run is evidence of: its profile, on as many GPUs as it ran on. A newer run of a group hides an older
    one's entries only within the group: a profile run on 4 GPUs never hides what it found on 2. The GPU count is
    named only where a profile's runs differ in it (`gpu-2gpus`, `gpu-4gpus`)."""
    meta = metas.get(run_id, {})
    profile = str(meta.get("profile", run_id))
    counts = {_gpus(m) for m in metas.values() if m.get("profile") == profile and not retired(m)}
    return profile if len(counts) <= 1 else f"{profile}-{_gpus(meta)}gpus"


def _gpus(meta: dict[str, Any]) -> int:
    return int((meta.get("hardware") or {}).get("gpu_count") or 0)


def _profile_of(record: dict[str, Any], metas: dict[str, dict[str, Any]]) -> str:
    return evidence_group(record["run_id"], metas) if record["run_id"] in metas else str(record["run_id"])


def shared_cells(records: list[dict[str, Any]], metas: dict[str, dict[str, Any]]) -> set[str]:
    """Cell ids that records of more than one profile carry."""
    profiles: dict[str, set[str]] = defaultdict(set)
    for record in records:
        profiles[record["cell"]].add(_profile_of(record, metas))
    return {cell for cell, names in profiles.items() if len(names) > 1}


def _shown_cell(cell: str, profile: str, shared: set[str]) -> str:
    return f"{cell}@{profile}" if cell in shared else cell


def qualify_shared_cells(
    records: list[dict[str, Any]], metas: dict[str, dict[str, Any]], shared: set[str] | None = None
) -> list[dict[str, Any]]:
    """Cells of one id in two profiles (the CPU history's `era_date-2024-02-29` and the GPU history's) are two
    cells: each is shown as `<cell>@<profile>` (the recorded id kept in `cell_at_run`), so neither's records
    replace the other's in the table, the reproducers or the atlas."""
    shared = shared_cells(records, metas) if shared is None else shared
    qualified = []
    for record in records:
        if record["cell"] in shared:
            shown = _shown_cell(record["cell"], _profile_of(record, metas), shared)
            record = record | {"cell": shown, "cell_at_run": record["cell"]}
        qualified.append(record)
    return qualified


def _shown_meta(run_dir: Path) -> dict[str, Any]:
    """meta.json with the status a reader should see: a `running` run whose writer died is `interrupted`."""
    meta = runs.read_meta(run_dir)
    return meta | {"status": runs.effective_status(run_dir, meta)}


Evidence = tuple[dict[str, Any], dict[str, Any]]  # (run meta, record)


def same_code(older: Evidence, newer: Evidence) -> bool:
    """Whether two records were made by the same scenario code (each record's own digest, else its run's);
    unknown (runs before digests were recorded) counts as the same, so a disagreement is shown rather than
    explained away."""

    def digest(evidence: Evidence) -> str | None:
        meta, record = evidence
        return record.get("scenario_digest") or (meta.get("scenario_digests") or {}).get(record["scenario"])

    a, b = digest(older), digest(newer)
    return a is None or b is None or a == b


def latest_by_key(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], set[tuple[str, ...]]]:
    """One record per key (the newest); keys whose outcomes disagree across runs are returned as flaky."""
    by_key: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_key[record_key(record)].append(record)
    chosen, flaky = [], set()
    for key, group in by_key.items():
        group.sort(key=lambda r: r.get("started_at", ""))
        if len({r["outcome"] for r in group}) > 1:
            flaky.add(key)
        chosen.append(group[-1])
    return chosen, flaky


def render_markdown(selection: Selection, specs: dict[str, dict[str, Any]] | None = None) -> str:
    """The table from the selected records; `specs` (scenario id -> SPEC) supply each scenario's target,
    controls, variant kinds, title and table metrics. Records of a scenario without a spec are shown plainly."""
    specs = specs or {}
    table_metrics = {sid: list(spec.get("table_metrics", [])) for sid, spec in specs.items()}
    titles = {sid: str(spec.get("title", "")) for sid, spec in specs.items()}
    records, flaky = selection.latest()
    cells = sorted({r["cell"] for r in records})
    scenarios = sorted({r["scenario"] for r in records}, key=lambda s: (int(s[1:].split("-")[0]), s))
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        grouped[(record["cell"], record["scenario"])].append(record)

    lines = [
        "# Compatibility table",
        "",
        "Generated by `nox -s report` from the records under `results/runs/`. Do not edit by hand.",
        "",
    ]
    lines += glance_markdown(records, specs, selection.pitfalls(specs))
    lines += _provenance(selection)
    lines += ["## Summary: baseline outcome and the fixes that work", ""]
    lines.append("| cell | " + " | ".join(md(s) for s in scenarios) + " |")
    lines.append("|---|" + "---|" * len(scenarios))
    for cell in cells:
        entries = [_summary_entry(grouped.get((cell, s), []), specs.get(s)) for s in scenarios]
        lines.append(f"| {code(cell)} | " + " | ".join(entries) + " |")
    lines += ["", "### Legend", "", LEGEND]
    lines += _inapplicable_section(records)
    lines += _unnamed_section(records)
    lines += _renamed_section(records)
    lines += _versions_table(cells, records)
    lines += _real_size_section(records)
    for scenario in scenarios:
        lines += _scenario_section(
            scenario, titles.get(scenario, ""), cells, grouped, table_metrics.get(scenario, []), flaky
        )
    return "\n".join(lines).rstrip() + "\n"


def _provenance(selection: Selection) -> list[str]:
    lines = [
        "## Provenance",
        "",
        "| run | profile | device | gpus | host | started | status | harness commit |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for meta in selection.metas:
        hw = meta.get("hardware", {})
        gpus = f"{hw.get('gpu_count', 0)} x {hw.get('gpu_name')}" if hw.get("gpu_count") else "0"
        # Each cell made safe by what it is, never by how its text starts (a profile named "`..." is text too).
        cells = [
            code(meta.get("run_id")),
            md(meta.get("profile")),
            md(hw.get("device")),
            md(gpus),
            md(hw.get("host", "")),
            md(meta.get("started_at", "")),
            md(meta.get("status", "")),
            code((meta.get("harness_commit") or "")[:10]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def changed_at_run_line(records: list[dict[str, Any]]) -> str:
    """How many of the not-applicable records were something else when they were written (today's applicability
    rules set them aside since): counted among the not-applicable records only."""
    aside = [r for r in records if r.get("signature") == "not-applicable"]
    changed = sum(1 for r in aside if r.get("outcome_at_run") not in (None, "skip"))
    return (
        f"{len(aside)} records are not applicable; {changed} of them had another outcome at run time "
        "(judged again with today's rules), the others were set aside when they were written."
    )


def _inapplicable_section(records: list[dict[str, Any]]) -> list[str]:
    """Records that are no evidence about the stack, by scenario and reason: what the job reported and why it is
    not counted (`scenarios/applicability.py`, applied when the record was written and again today)."""
    rows = _counts(
        (r["scenario"], r.get("reported_outcome") or "not run", short_reason(r))
        for r in records
        if r.get("signature") == "not-applicable"
    )
    lines = [
        "## Not applicable here",
        "",
        "A record is not applicable when this machine could not run the setup its config declares (FSDP2's CUDA "
        "streams on a CPU, 4-bit bitsandbytes on CPU before 0.46, a Trainer refusing bf16 without a GPU), or when "
        "the setup measured while it ran differs from the declared one (a 4-bit config whose model was loaded "
        "unquantized). It is never a pass or a fail: it leaves the target's count and the fixes' verdicts. "
        "Rules: `scenarios/applicability.py` and the scenarios' own checks (`scenarios/kit/measured.py`).",
        "",
    ]
    if not rows:
        return [*lines, "None.", ""]
    lines += [changed_at_run_line(records), ""]
    lines += ["| scenario | the job reported | why not applicable | records |", "|---|---|---|---|"]
    lines += [f"| {md(sid)} | {md(reported)} | {md(why)} | {n} |" for (sid, reported, why), n in rows.items()]
    return [*lines, ""]


def unnamed(signature: str | None) -> bool:
    return bool(signature) and str(signature).startswith("unclassified-")


def _unnamed_section(records: list[dict[str, Any]]) -> list[str]:
    """Failures no rule names yet, each with its message, count and where it was raised, so a reader (and the
    next rule) can tell them apart."""
    found = [r for r in records if unnamed(r.get("signature"))]
    if not found:
        return []
    lines = [
        "## Unnamed failures",
        "",
        "Failures that no rule in `scenarios/failure_names.py` names yet; each is shown in the tables as "
        "`unnamed <type> <id>`.",
        "",
        "| shown as | message | where | records | cells |",
        "|---|---|---|---|---|",
    ]
    from harness.recording.signatures import innermost_frames

    for sig, n in _counts(r["signature"] for r in found).items():
        first = next(r for r in found if r["signature"] == sig)
        cells = sorted({r["cell"] for r in found if r["signature"] == sig})
        where = " < ".join(innermost_frames(first.get("traceback") or ""))
        lines.append(
            f"| {code(display_name(sig))} | {_one_line(first.get('message') or '(empty)')} | {code(where)} | {n} | "
            f"{md(', '.join(cells[:4]) + (' ...' if len(cells) > 4 else ''))} |"
        )
    return [*lines, ""]


def display_name(signature: str | None) -> str | None:
    """How a failure name is shown: a name no rule gives yet reads `unnamed <type> <id>`."""
    if not unnamed(signature):
        return signature
    _, kind, digest = str(signature).split("-", 2) if str(signature).count("-") >= 2 else ("", "", str(signature))
    return f"unnamed {kind} {digest}"


def named_code(signature: object) -> str:
    return code(display_name(str(signature)) if signature is not None else signature)


def _renamed_section(records: list[dict[str, Any]]) -> list[str]:
    """Where today's signature rules name a failure differently from the rules it was recorded under."""
    lines = [
        "## Failure names",
        "",
        "Every failure is named when this table is made, with today's rules (`harness/recording/signatures.py`, "
        f"digest `{RULES_DIGEST}`), from the exception type, message and traceback its record kept. The record keeps "
        "the name it got at run time (its `signature_rules` digest says which rules gave it).",
        "",
    ]
    changed = _counts((r["signature_at_run"], r["signature"]) for r in records if r.get("signature_at_run"))
    if not changed:
        return [*lines, "No name differs from the one given at run time.", ""]
    lines += ["| name at run time | name today | records |", "|---|---|---|"]
    lines += [f"| {named_code(old)} | {named_code(new)} | {count} |" for (old, new), count in changed.items()]
    return [*lines, ""]


def real_size_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """S5 records of real-size configs (an explicit `intermediate`): one row per peft release, base, autocast
    and variant, with LoRA and DoRA peak MiB, their ratio and step times."""
    rows = []
    for r in records:
        config, metrics = r.get("config") or {}, r.get("metrics") or {}
        if not r["scenario"].startswith("S5-") or not config.get("intermediate") or "lora_peak_bytes" not in metrics:
            continue
        rows.append(
            {
                "peft": (r.get("versions") or {}).get("peft", "?"),
                "shape": f"{config['hidden']}/{config['intermediate']} x{config['layers']}, "
                f"vocab {config.get('vocab', '?')}, {config['batch']}x{config['seq']}",
                "base": "nf4 (QLoRA/QDoRA)" if config.get("base") == "4bit" else f"{config.get('dtype')} (LoRA/DoRA)",
                "autocast": bool(config.get("autocast")),
                "variant": r["variant"],
                "outcome": r["outcome"] if r["outcome"] == "pass" else f"{r['outcome']} {r.get('signature')}",
                "lora_mib": metrics["lora_peak_bytes"] / 2**20,
                "dora_mib": metrics["dora_peak_bytes"] / 2**20,
                "ratio": metrics.get("dora_lora_peak_ratio"),
                "lora_step_s": metrics.get("lora_step_s"),
                "dora_step_s": metrics.get("dora_step_s"),
                "device": (r.get("hardware") or {}).get("gpu_name") or "cpu",
            }
        )
    return sorted(rows, key=_real_size_order)


def _real_size_order(row: dict[str, Any]) -> tuple:
    release = tuple(int(x) for x in row["peft"].split(".")[:3] if x.isdigit())
    return release, row["base"], row["autocast"], row["variant"] != "baseline", row["variant"]


def _real_size_section(records: list[dict[str, Any]]) -> list[str]:
    rows = real_size_rows(records)
    if not rows:
        return []
    lines = [
        "## S5 at real size: DoRA vs LoRA memory per peft release",
        "",
        "Decoder layers of a real model's shape (hidden/intermediate size, layers, vocabulary and batch x "
        "sequence as in the shape column), built in code; peak `torch.cuda.max_memory_allocated` over one "
        "forward+backward above the memory held before it: activations, temporaries and the logits "
        "(batch x seq x vocab), not the weights. The median step time beside it. A run that "
        "failed before measuring (e.g. peft 0.9 refusing DoRA on a 4-bit layer) is in the S5 section below. "
        "Plot: [`results/s5-real-size.png`](s5-real-size.png).",
        "",
        "| peft | shape (hidden/intermediate x layers, vocab, batch x seq) | base | autocast | variant | outcome "
        "| LoRA MiB | DoRA MiB | DoRA/LoRA | LoRA step s | DoRA step s | device |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {md(row['peft'])} | {md(row['shape'])} | {md(row['base'])} | {'yes' if row['autocast'] else 'no'} | "
            f"{md(row['variant'])} | {md(row['outcome'])} | {row['lora_mib']:.0f} | {row['dora_mib']:.0f} | "
            f"{_fmt(row['ratio']) if row['ratio'] else '-'} | {row['lora_step_s']} | {row['dora_step_s']} | "
            f"{md(row['device'])} |"
        )
    return [*lines, ""]


def _versions_table(cells: list[str], records: list[dict[str, Any]]) -> list[str]:
    by_cell: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_cell[record["cell"]].append(record)
    resolved = {cell: fullest_versions(cell_records) for cell, cell_records in by_cell.items()}
    columns = ["python", *AXIS_PACKAGES]
    lines = [
        "## Resolved versions per cell",
        "",
        "| cell | " + " | ".join(columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for cell in cells:
        versions = resolved.get(cell, {})
        lines.append(f"| {code(cell)} | " + " | ".join(md(versions.get(c, "-")) for c in columns) + " |")
    return [*lines, ""]


def _summary_entry(records: list[dict[str, Any]], spec: dict[str, Any] | None) -> str:
    """One cell x scenario: the target apart from other failures, the fixes on exactly the target's configs
    (each marked fix or workaround), the controls, and how it ran."""
    return " <br>".join(headline(verdict(records, spec), spec, named_code, md))


def _scenario_section(
    scenario: str,
    title: str,
    cells: list[str],
    grouped: dict[tuple[str, str], list[dict[str, Any]]],
    metrics: list[str],
    flaky: set[tuple[str, ...]],
) -> list[str]:
    records = [r for c in cells for r in grouped.get((c, scenario), [])]
    variants = sorted({r["variant"] for r in records}, key=lambda v: (v != "baseline", v.count("+"), v))
    heading = f"## {md(scenario)}" + (f": {md(title)}" if title else "")
    lines = [
        f'<a id="{scenario_anchor(scenario)}"></a>',
        "",
        heading,
        "",
        f"Per variant, over the configs tried. Metrics shown: {', '.join(metrics) or 'none'}.",
        "",
        "| cell | " + " | ".join(md(v) for v in variants) + " |",
        "|---|" + "---|" * len(variants),
    ]
    for cell in cells:
        row = grouped.get((cell, scenario), [])
        if not row:
            continue
        entries = []
        for variant in variants:
            subset = [r for r in row if r["variant"] == variant]
            entries.append(_variant_entry(subset, metrics, flaky))
        lines.append(f"| {code(cell)} | " + " | ".join(entries) + " |")
    notes = sorted({(r["cell"], r["message"]) for r in records if r["outcome"] in ("skip", "install-failed")})
    if notes:
        lines += ["", "Skipped or not installed:", ""]
        lines += [f"- {code(cell)}: {_one_line(message)}" for cell, message in notes]
    paths = sorted({str(r.get("path")) for r in records if r.get("path")})
    if paths:
        lines += ["", "Code paths that ran: " + ", ".join(f"{code(p)}" for p in paths)]
    return [*lines, ""]


def _variant_entry(subset: list[dict[str, Any]], metrics: list[str], flaky: set[tuple[str, ...]]) -> str:
    if not subset:
        return "-"
    counts = _counts(r["outcome"] for r in subset)
    parts = []
    for outcome, n in counts.items():
        sigs = _counts(r["signature"] for r in subset if r["outcome"] == outcome and r["signature"])
        sig_text = "".join(f" {named_code(s)}" for s in sigs if outcome not in UNSIGNED)
        parts.append(f"{outcome} {n}/{len(subset)}{sig_text}")
    for name in metrics:
        values = [r["metrics"].get(name) for r in subset if isinstance(r.get("metrics", {}).get(name), int | float)]
        if values and name.endswith("_bytes"):
            parts.append(f"{name.removesuffix('_bytes')}={statistics.median(values) / 2**20:.2f} MiB")
        elif values:
            parts.append(f"{name}={_fmt(statistics.median(values))}")
    if any(record_key(r) in flaky for r in subset):
        parts.append("**flaky**")
    return " <br>".join(parts)


def _counts(items: Iterable[Any]) -> dict[Any, int]:
    counts: dict[Any, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0]))))


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def _one_line(text: str) -> str:
    """Exception text in a Markdown cell: one line of at most 300 characters, pipes and HTML neutralised."""
    return md(" ".join((text or "").split())[:300])
