"""Advisories tools can read, and `compat-matrix audit` (issue 59): every committed advisory is valid OSV and each of
its events names records at exactly that release; audit judges a lockfile and a setup by every condition of an advisory,
says the way out, and never calls a release the atlas never measured clean."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from harness.knowledge.judge import Query, evaluate
from harness.knowledge.selection import probe_records
from harness.knowledge.store import Store
from harness.recording.packing import run_dirs
from harness.recording.records import read_records
from harness.tools.answers import audit
from scenarios.failure_names import family as failure_family

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
SCHEMA = json.loads((REPO / "harness" / "publishing" / "osv" / "schema.json").read_text())
STACK = "torch==2.11.0\ntransformers==5.14.1\npeft==0.20.0\naccelerate==1.14.0\n"
FSDP = "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nfsdp_config:\n  fsdp_version: {v}\n"


def committed() -> list[dict]:
    index = json.loads((RESULTS / "advisories" / "index.json").read_text())
    return [json.loads((RESULTS / "advisories" / e["file"]).read_text()) for e in index]


def test_every_advisory_is_valid_osv_and_the_index_lists_every_file() -> None:
    found = committed()
    assert len(found) >= 10
    for advisory in found:
        jsonschema.Draft202012Validator(SCHEMA).validate(advisory)
        assert advisory["id"].startswith("x_COMPAT-MATRIX-")
        for entry in advisory["affected"]:
            assert entry["package"]["ecosystem"] == "PyPI" and entry["ranges"][0]["type"] == "ECOSYSTEM"
    files = {p.name for p in (RESULTS / "advisories").glob("x_*.json")}
    assert files == {f"{a['id']}.json" for a in found}


def test_every_event_names_records_at_that_exact_release_and_the_one_before() -> None:
    """The evidence rule, with zero exceptions: every `introduced` or `fixed` event is backed by records at exactly that
    release that show what it claims (the failure where it was introduced, a pass where it was fixed), and, unless it
    is the oldest release measured (a bound, said so), by records at the release before it that show the other state
    or, where they failed another way, a masking note (so an OSV reader never takes that release for clean); the
    records named really hold those releases."""
    runs = {d.name: d for d in run_dirs(RESULTS)}
    checked, violations = 0, []
    for advisory in committed():
        mine = failure_family(advisory["database_specific"]["failure"])
        for entry in advisory["database_specific"]["evidence"]:
            package = entry["package"]
            for event in entry["events"]:
                kind = "introduced" if "introduced" in event else "fixed"
                claim, before_claim = ("fail", "pass") if kind == "introduced" else ("pass", "fail")
                if not any(_shows(r, claim, mine) for r in event["records"]):
                    violations.append((advisory["id"], package, kind, event[kind], "no record at the release"))
                if event.get("bound"):
                    assert event["bound"] == "earliest measured"
                else:
                    before = event["before"]
                    shown = any(_shows(r, before_claim, mine) for r in before["records"])
                    if not before["release"] or not (shown or (event.get("masked") and before["records"])):
                        violations.append((advisory["id"], package, kind, event[kind], "no record before it"))
                for named in [*event["records"], *(event.get("before") or {}).get("records", [])]:
                    release = event[kind] if named in event["records"] else event["before"]["release"]
                    if "finding" in named:
                        finding = REPO / "results" / "findings" / named["finding"] / "runs.jsonl"
                        versions = [json.loads(x)["version"] for x in finding.read_text().splitlines() if x.strip()]
                        assert release in versions
                        continue
                    records = read_records(runs[named["run_id"]] / "records.jsonl")
                    cell = named["cell"].split("@")[0]  # the table qualifies a cell two profiles share
                    held = [r for r in records if r["config_id"] == named["config_id"] and r["cell"] == cell]
                    assert any(str(r["versions"].get(package, "")).split("+")[0] == release for r in held), named
                checked += 1
    assert violations == []
    assert checked >= 40


def _shows(record: dict, outcome: str, family: str) -> bool:
    """Whether a cited record shows `outcome` of this failure: a failure of its family, or a pass."""
    if record.get("outcome") != outcome:
        return False
    return outcome == "pass" or "finding" in record or failure_family(record.get("signature")) == family


def _audit(tmp_path: Path, text: str, *args: str, name: str = "requirements.txt") -> subprocess.CompletedProcess:
    path = tmp_path / name
    path.write_text(text)
    return subprocess.run([sys.executable, "-m", "harness", "audit", str(path), *args], capture_output=True,
                          text=True, cwd=REPO)  # fmt: skip


def answers(done: subprocess.CompletedProcess) -> list[dict]:
    return json.loads(done.stdout)["answers"]


def judged(versions: dict[str, str], setup: dict | None = None) -> dict[str, dict]:
    """failure id -> the judge's answer for these releases, given as a requirements file gives them (the packages it
    leaves out are not given, not absent), over the tables audit reads."""
    tables = audit.load_tables(RESULTS)
    return {a["id"]: a for a in evaluate(tables, Query(versions, setup or {}, partial=True))}


def test_fsdp2_gets_the_accelerate_upgrade_and_fsdp1_its_own_advisory(tmp_path: Path) -> None:
    (tmp_path / "fsdp2.yaml").write_text(FSDP.format(v=2))
    (tmp_path / "fsdp1.yaml").write_text(FSDP.format(v=1))
    two = _audit(tmp_path, STACK, "--accelerate-config", str(tmp_path / "fsdp2.yaml"), "--gpus", "2")
    assert two.returncode == 1, two.stdout + two.stderr
    assert (
        "the Trainer · FSDP2 · LoRA" in two.stdout and "upgrade accelerate to 1.15.0 (measured): ends it" in two.stdout
    )
    assert "recommended pins" in two.stdout and "accelerate==1.15.0 (--fix:" in two.stdout  # one line, no diff
    assert "uv add" not in two.stdout
    fixed = _audit(tmp_path, STACK, "--accelerate-config", str(tmp_path / "fsdp2.yaml"), "--gpus", "2", "--fix")
    assert fixed.returncode == 1 and fixed.stdout.startswith(two.stdout.split("recommended pins")[0])
    # a unified diff of the requirements file read, then the install lines
    assert "  -accelerate==1.14.0\n  +accelerate==1.15.0" in fixed.stdout, fixed.stdout
    assert "uv add 'accelerate==1.15.0'" in fixed.stdout and "pip install 'accelerate==1.15.0'" in fixed.stdout
    as_json = json.loads(_audit(tmp_path, STACK, "--accelerate-config", str(tmp_path / "fsdp2.yaml"), "--gpus", "2",
                                "--format", "json").stdout)  # fmt: skip
    assert as_json["way_out"]["install"]["uv"] == "uv add 'accelerate==1.15.0'"
    assert "+accelerate==1.15.0" in as_json["way_out"]["install"]["diff"]
    assert "the Trainer · FSDP1 · LoRA" not in two.stdout  # the FSDP1 failures are another setup's
    one = _audit(
        tmp_path, STACK, "--accelerate-config", str(tmp_path / "fsdp1.yaml"), "--gpus", "2", "--format", "json"
    )
    found = json.loads(one.stdout)
    resume = [a for a in found["answers"] if a["scenario"] == "S9-identity-resume" and a["state"] == "applies"]
    assert [a["setups"] for a in resume] == [["the Trainer · FSDP1 · LoRA"]]
    assert found["way_out"]["pins"] == {"peft": "0.19.1"}  # the last release measured good: a pin


def test_a_lock_inside_a_range_reports_it_and_just_past_the_fix_does_not(tmp_path: Path) -> None:
    lock = '[[package]]\nname = "{n}"\nversion = "{v}"\n'
    stack = "".join(lock.format(n=n, v=v) for n, v in (("torch", "2.11.0"), ("transformers", "5.14.1"),
                                                      ("peft", "0.20.0")))  # fmt: skip
    args = ("--setup", "fsdp2,lora", "--gpus", "2", "--format", "json")
    inside = answers(_audit(tmp_path, stack + lock.format(n="accelerate", v="1.14.0"), *args, name="uv.lock"))
    assert any(a["scenario"] == "S9-identity-resume" and a["state"] == "applies" for a in inside)
    past = answers(_audit(tmp_path, stack + lock.format(n="accelerate", v="1.15.0"), *args, name="uv.lock"))
    assert not any(a["scenario"] == "S9-identity-resume" and a["state"] == "applies" for a in past), past


def test_a_release_no_record_holds_is_undecided_never_clean() -> None:
    """S2 on CPU: transformers 4.57.6 fails and 5.0.0 passes, measured; 6.1.0 lies above anything measured, 5.0.1
    inside a measured clear range is bracketed, never exact."""
    s2 = next(f for f in audit.load_tables(RESULTS)["failures"] if f["scenario"] == "S2-qlora-grad-flags"
              and f["device"] == "cpu" and f["conditions"] == ["transformers"])  # fmt: skip
    assert judged({"transformers": "6.1.0"})[s2["id"]]["state"] == "undecided"
    assert judged({"transformers": "4.57.6"})[s2["id"]]["state"] == "applies"
    assert judged({"transformers": "5.0.0"})[s2["id"]]["state"] == "clean"
    assert judged({"transformers": "4.57.6"})[s2["id"]]["sure"] == "bracketed"  # torch, peft, bnb not given


def test_a_malformed_lockfile_exits_2_with_its_line(tmp_path: Path) -> None:
    bad = _audit(tmp_path, "torch==2.11.0\npeft===\n")
    assert bad.returncode == 2 and "requirements.txt:2" in bad.stderr and bad.stderr.count("\n") == 1
    broken = _audit(tmp_path, "[[package]\nname=", name="uv.lock")
    assert broken.returncode == 2 and "not a lockfile" in broken.stderr
    (tmp_path / "acc.yaml").write_text("no colon here\n")
    config = _audit(tmp_path, STACK, "--accelerate-config", str(tmp_path / "acc.yaml"))
    assert config.returncode == 2 and "acc.yaml: not an accelerate config YAML" in config.stderr


@pytest.mark.matrix
def test_audit_of_a_real_environment_reports_only_what_applies_to_its_setup(tmp_path: Path) -> None:
    """--python reads a real environment (the CI profile's current stack: torch, transformers, peft, accelerate of
    today); with a DDP LoRA setup no FSDP, ZeRO-3 or DoRA advisory is reported."""
    from harness.define.cells import expand
    from harness.define.profile import load_profile
    from harness.environments.envs import InstallOptions, default_envs_dir, ensure_env
    from harness.paths import MATRIX_DIR

    ci = load_profile("ci", MATRIX_DIR)
    env = ensure_env(next(c for c in expand(ci) if c.cell_id.startswith("current")), ci,
                     InstallOptions(envs_dir=default_envs_dir()))  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "harness", "audit", "--python", str(env.python), "--setup",
                           "ddp,lora", "--format", "json"], capture_output=True, text=True, cwd=REPO)  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    for found in answers(done):
        setups = str(found.get("when"))
        assert not any(word in setups for word in ("FSDP", "ZeRO", "DoRA", "QLoRA")), found


def test_probe_records_are_read_beside_the_table() -> None:
    assert probe_records(Store(RESULTS))  # the sweeps and flips' probes back the advisories' events


def test_a_release_below_the_oldest_failing_one_is_undecided_and_open_in_osv() -> None:
    """The FSDP2 resume failure first shows with accelerate 1.13.0, the oldest release measured with it: accelerate
    1.12.0 was never measured with it, so the judge cannot call it clean, and OSV's own fields leave the range open
    below (introduced "0"), so a tool reading only them cannot either."""
    advisory = next(a for a in committed() if a["database_specific"]["scenario"] == "S9-identity-resume"
                    and a["database_specific"]["setup_keys"][0].get("engine") == "fsdp2")  # fmt: skip
    first = advisory["database_specific"]["evidence"][0]["events"][0]
    assert first.get("bound") == "earliest measured"
    assert advisory["affected"][0]["ranges"][0]["events"][0] == {"introduced": "0"}
    below = judged({"accelerate": "1.12.0"}, {"engine": "fsdp2"})[advisory["id"]]
    assert below["state"] == "undecided" and "older than 1.13.0" in below["why"]
    assert judged({"accelerate": "1.14.0"}, {"engine": "fsdp2"})[advisory["id"]]["state"] == "applies"


def test_a_setup_that_already_has_the_measured_fix_is_cleared(tmp_path: Path) -> None:
    """SHARDED_STATE_DICT passed where the FSDP2 resume baseline failed (accelerate 1.14.0): a config that declares
    it is not affected, and the Trainer's SHARDED_STATE_DICT adapter save, which fails on every release measured, is
    said as a pitfall of that setup; one that declares FULL_STATE_DICT (which failed there too) is affected."""
    sharded = FSDP.format(v=2) + "  fsdp_state_dict_type: SHARDED_STATE_DICT\n"
    full = FSDP.format(v=2) + "  fsdp_state_dict_type: FULL_STATE_DICT\n"
    states = {}
    for name, text in (("sharded", sharded), ("full", full)):
        (tmp_path / f"{name}.yaml").write_text(text)
        done = _audit(tmp_path, STACK, "--accelerate-config", str(tmp_path / f"{name}.yaml"), "--gpus", "2",
                      "--format", "json")  # fmt: skip
        found = answers(done)
        states[name] = {a["state"] for a in found if a["scenario"] == "S9-identity-resume"}
        states[name + " pitfalls"] = {a["when"] for a in found if a["state"] == "pitfall" and "S7" in a["scenario"]}
    assert states["sharded"] == {"cleared"} and states["full"] == {"applies"}
    assert states["sharded pitfalls"] == {"the Trainer · FSDP2 · SHARDED_STATE_DICT · LoRA"}
    assert states["full pitfalls"] == set()


def test_a_requirements_file_that_leaves_a_package_out_is_undecided_a_lock_is_not(tmp_path: Path) -> None:
    """torch is often installed apart from a project's requirements: a requirements file without it cannot clear a
    failure torch brings; a lock without it has no torch, and the failure cannot happen."""
    args = ("--setup", "zero3,lora", "--gpus", "0", "--format", "json")
    loose = answers(_audit(tmp_path, "deepspeed==0.16.1\n", *args))
    assert any(a["state"] == "undecided" and "torch is not in your files" in a["why"] for a in loose)
    locked = '[[package]]\nname = "deepspeed"\nversion = "0.16.1"\n'
    assert not any("torch is not in your files" in a["why"] or "not given" in a["why"]
                   for a in answers(_audit(tmp_path, locked, *args, name="uv.lock")))  # fmt: skip


def test_a_failure_one_package_brings_and_another_ends_is_one_advisory() -> None:
    """S4 on CPU: torch 2.5.0 brought the ZeRO-3 checkpointing failure and deepspeed 0.19.3 ended it on the same
    configs. One advisory holds both as a conjunction (torch 2.13.0 with deepspeed 0.19.3 is clear, with 0.19.2 it is
    not, torch 2.4.1 is clear); OSV's own fields name both packages (any of them)."""
    s4 = [a for a in committed() if a["database_specific"]["scenario"] == "S4-zero3-lora-checkpoint"
          and a["database_specific"]["device"] == "cpu"]  # fmt: skip
    both = [a for a in s4 if {c["package"] for c in a["database_specific"]["conditions"]} == {"torch", "deepspeed"}]
    assert len(both) == 1
    advisory = both[0]
    configs = set(advisory["database_specific"]["config_ids"])
    assert not [a for a in s4 if a is not advisory and set(a["database_specific"]["config_ids"]) & configs]
    state = {}
    for torch, deepspeed in (("2.13.0", "0.19.3"), ("2.13.0", "0.19.2"), ("2.4.1", "0.16.1")):
        state[(torch, deepspeed)] = judged({"torch": torch, "deepspeed": deepspeed})[advisory["id"]]["state"]
    assert state == {("2.13.0", "0.19.3"): "clean", ("2.13.0", "0.19.2"): "applies", ("2.4.1", "0.16.1"): "clean"}
    assert {e["package"]["name"] for e in advisory["affected"]} == {"torch", "deepspeed"}


def test_a_condition_on_the_model_fails_the_gate_only_under_strict(tmp_path: Path) -> None:
    """LoRA on the 2025-11-14 stack (a lock: torch, transformers, peft and accelerate, nothing else installed): the
    round trips measured failing there need adapter names or a head a lockfile cannot show, so they APPLY IF those
    hold: exit 0, and 1 under --strict."""
    stack = {"torch": "2.9.1", "transformers": "4.57.1", "peft": "0.18.0", "accelerate": "1.11.0"}
    lock = "".join(f'[[package]]\nname = "{name}"\nversion = "{version}"\n\n' for name, version in stack.items())
    args = ("--setup", "lora,hand", "--gpus", "0")  # a loop by hand: the Trainer's failures are another setup's
    relaxed = _audit(tmp_path, lock, *args, "--format", "json", name="uv.lock")
    found = answers(relaxed)
    assert relaxed.returncode == 0 and not [a for a in found if a["state"] == "applies"], relaxed.stdout
    conditional = [a for a in found if a["state"] == "applies-if"]
    assert conditional and all(a["applies_if"] and "{" not in a["applies_if"] for a in conditional)
    assert any("'lora_'" in a["applies_if"] for a in conditional)
    assert _audit(tmp_path, lock, *args, "--strict", name="uv.lock").returncode == 1
