"""Every upstream reference a flip or an advisory cites is the one its config's trigger names (issue 73): one table
(`failure_names.UPSTREAM_HISTORY`, each record about a feature with its trigger), never a record of another feature
picked because it was the first of its direction."""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any

from harness.knowledge.atlas import Atlas
from harness.publishing import advisories
from harness.publishing.atlas import configs_of, upstream_verdict
from scenarios.failure_names import UPSTREAM_HISTORY, trigger_holds, upstream_change
from tests.conftest import REPO_ROOT

RESULTS = REPO_ROOT / "results"
WEIGHT = {"names": {"q": "weight", "v": "v_proj"}, "heads": ["score"], "adapters": ["default"]}
HEADS = {"names": {"q": "q_proj", "v": "v_proj"}, "heads": ["score", "score_1"], "adapters": ["default"]}


@cache
def atlas() -> Atlas:
    return Atlas(RESULTS)


def test_a_target_named_weight_cites_peft_2772_and_two_heads_cite_2289() -> None:
    weight = upstream_change("check-roundtrip-load", "not-reproduced", ("peft", "0.18.0"), [WEIGHT])
    heads = upstream_change("check-roundtrip-load", "not-reproduced", ("peft", "0.15.0"), [HEADS])
    assert weight is not None and "#2772" in weight["source"] and weight["release"] == "0.18.0"
    assert heads is not None and "#2289" in heads["source"] and "#2038" not in heads["source"]
    # A record about a feature is never cited where the configs are not known.
    assert upstream_change("check-roundtrip-load", "not-reproduced", ("peft", "0.18.0")) is None


def test_every_trigger_holds_for_the_configs_it_was_written_for() -> None:
    for family, records in UPSTREAM_HISTORY.items():
        for record in records:
            if len(record) > 4:
                alternatives = record[4].split("|")
                assert all(re.match(r"^[\w.]+[=~#].+$", a) for a in alternatives), (family, record[4])
    assert trigger_holds("names~weight", WEIGHT) and not trigger_holds("names~weight", HEADS)
    assert trigger_holds("heads#2", HEADS) and not trigger_holds("heads#2", WEIGHT)


def cited(advisory: dict[str, Any]) -> tuple[set[str], set[str]]:
    """(issue numbers, releases) an advisory's references name."""
    numbers = {u["url"].rsplit("/", 1)[1] for u in advisory["references"] if u["type"] == "REPORT"}
    releases = {u["url"].rstrip("/").rsplit("/", 1)[1] for u in advisory["references"] if u["type"] == "WEB"}
    return numbers, releases


def test_every_s10_advisory_cites_only_what_its_configs_trigger() -> None:
    found = atlas()
    for advisory in advisories.build(found):
        failure = found.failure(advisory["id"])
        if not failure.scenario.startswith("S10"):
            continue
        configs = [found.configs.get((failure.scenario, c), {}) for c in failure.config_ids]
        family = failure.signature.removeprefix("check-")
        allowed_numbers, allowed_releases = set(), set()
        for record in UPSTREAM_HISTORY.get(family, []):
            if len(record) < 5 or any(trigger_holds(record[4], c) for c in configs):
                allowed_numbers |= set(re.findall(r"#(\d+)", record[2]))
                allowed_releases.add(record[1])
        numbers, releases = cited(advisory)
        assert numbers <= allowed_numbers, (advisory["id"], numbers, allowed_numbers)
        assert releases <= allowed_releases, (advisory["id"], releases, allowed_releases)


def test_the_weight_target_advisory_links_0_18_0() -> None:
    found = atlas()
    for advisory in advisories.build(found):
        failure = found.failure(advisory["id"])
        configs = [found.configs.get((failure.scenario, c), {}) for c in failure.config_ids]
        ended = [e.release for c in failure.conditions for e in c.events if e.kind == "fixed"]
        if failure.scenario.startswith("S10") and configs and all(trigger_holds("names.q~weight", c) for c in configs):
            if ended == ["0.18.0"]:
                assert cited(advisory)[1] <= {"0.18.0"}, advisory["references"]
                assert "0.15.0" not in json.dumps(advisory["references"])


def test_every_s10_flip_cites_the_record_its_configs_trigger() -> None:
    found = atlas()
    records = [*found.table, *found.probes]
    checked = 0
    for flip in found.flips:
        if not flip.scenario.startswith("S10") or not flip.package:
            continue
        configs = configs_of(flip, records)
        known = upstream_verdict(flip, configs)
        if known is None:
            continue
        record = next(r for r in UPSTREAM_HISTORY[flip.signature.removeprefix("check-")] if r[2] == known["source"])
        assert len(record) < 5 or any(trigger_holds(record[4], c) for c in configs or []), (flip.scenario, record)
        checked += 1
    assert checked
