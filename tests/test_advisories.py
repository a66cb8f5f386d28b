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

from harness.knowledge.selection import probe_records
from harness.recording.packing import run_dirs
from harness.recording.records import read_records
from harness.tools import audit
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


def test_every_event_names_records_at_that_exact_release() -> None:
    """The evidence rule: an `introduced` or `fixed` event is backed by records at that release that show what it
    claims (a bound the atlas did not measure says so), and the records it names really hold that release."""
    runs = {d.name: d for d in run_dirs(RESULTS)}
    checked = 0
    for advisory in committed():
        for entry in advisory["database_specific"]["evidence"]:
            package = entry["package"]
            for event in entry["events"]:
                release = event.get("introduced") or event.get("fixed")
                if event.get("bound", "").startswith("not measured"):
                    continue
                assert event["records"], (advisory["id"], package, release)
                # the outcome the event claims at that release: the failure where it was introduced, a pass where
                # it was fixed (and the other way round at the release before it)
                mine = failure_family(advisory["database_specific"]["failure"])

                def this_failure(record: dict, mine: str = mine) -> bool:
                    return record.get("outcome") == "fail" and failure_family(record.get("signature")) == mine

                at, before = event["records"], (event.get("before") or {}).get("records")
                if "introduced" in event:
                    assert any(this_failure(r) for r in at if "finding" not in r) or any("finding" in r for r in at)
                    assert not before or any(not this_failure(r) for r in before), (advisory["id"], event)
                else:
                    assert any(r.get("outcome", "pass") == "pass" for r in at), (advisory["id"], event)
                    assert not before or any(r.get("outcome", "fail") == "fail" for r in before), advisory["id"]
                for named in event["records"]:
                    if "finding" in named:
                        finding = REPO / "results" / "findings" / named["finding"] / "runs.jsonl"
                        versions = [json.loads(x)["version"] for x in finding.read_text().splitlines() if x.strip()]
                        assert release in versions
                        continue
                    records = read_records(runs[named["run_id"]] / "records.jsonl")
                    cell = named["cell"].split("@")[0]  # the table qualifies a cell two profiles share
                    mine = [r for r in records if r["config_id"] == named["config_id"] and r["cell"] == cell]
                    assert any(str(r["versions"].get(package, "")).split("+")[0] == release for r in mine), named
                checked += 1
    assert checked >= 20


def _audit(tmp_path: Path, text: str, *args: str, name: str = "requirements.txt") -> subprocess.CompletedProcess:
    path = tmp_path / name
    path.write_text(text)
    return subprocess.run([sys.executable, "-m", "harness", "audit", str(path), *args], capture_output=True,
                          text=True, cwd=REPO)  # fmt: skip


def test_fsdp2_gets_the_accelerate_upgrade_and_fsdp1_its_own_advisory(tmp_path: Path) -> None:
    (tmp_path / "fsdp2.yaml").write_text(FSDP.format(v=2))
    (tmp_path / "fsdp1.yaml").write_text(FSDP.format(v=1))
    two = _audit(tmp_path, STACK, "--accelerate-config", str(tmp_path / "fsdp2.yaml"))
    assert two.returncode == 1, two.stdout + two.stderr
    assert "FSDP2 · LoRA" in two.stdout and "way out: upgrade accelerate to 1.15.0" in two.stdout
    assert "FSDP1 · LoRA" not in two.stdout  # the FSDP1 advisories are another setup's
    one = _audit(tmp_path, STACK, "--accelerate-config", str(tmp_path / "fsdp1.yaml"), "--format", "json")
    found = json.loads(one.stdout)
    resume = [f for f in found if "S9-identity-resume" in f["summary"]]
    assert [f["setups"] for f in resume] == [["FSDP1 · LoRA"]]
    assert not any("upgrade accelerate" in w for w in resume[0]["way_out"])
    assert "no release of peft after yours ends it: pin peft 0.19.1" in resume[0]["way_out"]


def test_a_lock_inside_a_range_reports_it_and_just_past_the_fix_does_not(tmp_path: Path) -> None:
    lock = '[[package]]\nname = "{n}"\nversion = "{v}"\n'
    inside = lock.format(n="accelerate", v="1.14.0") + lock.format(n="transformers", v="5.14.1")
    past = lock.format(n="accelerate", v="1.15.0") + lock.format(n="transformers", v="5.14.1")
    args = ("--setup", "fsdp2,lora", "--device", "cuda", "--format", "json")
    assert any("S9-identity-resume" in f["summary"] and f["state"] == "applies"
               for f in json.loads(_audit(tmp_path, inside, *args, name="uv.lock").stdout))  # fmt: skip
    after = _audit(tmp_path, past, *args, name="uv.lock")
    assert not any("S9-identity-resume" in f["summary"] for f in json.loads(after.stdout)), after.stdout


def test_a_release_in_an_unmeasured_gap_is_undecided_never_clean() -> None:
    advisory = next(a for a in committed() if a["database_specific"]["scenario"] == "S2-qlora-grad-flags"
                    and a["database_specific"]["device"] == "cpu")  # fmt: skip
    # transformers 4.57.6 failed and 5.0.0 passed: inside that gap nothing is between; far outside it, nothing measured.
    found = audit.judge(advisory, {"transformers": "6.1.0"}, {})
    assert found is not None and found.state == "undecided" and "outside the releases measured" in found.why
    assert audit.judge(advisory, {"transformers": "4.57.6"}, {}).state == "applies"
    assert audit.judge(advisory, {"transformers": "5.0.0"}, {}) is None


def test_a_malformed_lockfile_exits_2_with_its_line(tmp_path: Path) -> None:
    bad = _audit(tmp_path, "torch==2.11.0\npeft===\n")
    assert bad.returncode == 2 and "requirements.txt:2" in bad.stderr and bad.stderr.count("\n") == 1
    broken = _audit(tmp_path, "[[package]\nname=", name="uv.lock")
    assert broken.returncode == 2 and "not a lockfile" in broken.stderr
    (tmp_path / "acc.yaml").write_text("no colon here\n")
    config = _audit(tmp_path, STACK, "--accelerate-config", str(tmp_path / "acc.yaml"))
    assert config.returncode == 2 and "acc.yaml:1" in config.stderr


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
    for found in json.loads(done.stdout):
        setups = " ".join(found["setups"])
        assert not any(word in setups for word in ("FSDP", "ZeRO", "DoRA", "QLoRA")), found


def test_probe_records_are_read_beside_the_table() -> None:
    assert probe_records(RESULTS)  # the sweeps and flips' probes back the advisories' events


def test_a_release_below_the_oldest_failing_one_is_undecided_and_open_in_osv() -> None:
    """The FSDP2 resume failure first shows with accelerate 1.13.0, the oldest release measured with transformers
    5.14.1: accelerate 1.12.0 was never measured with it, so audit cannot call it clean, and OSV's own fields leave
    the range open below (introduced "0"), so a tool reading only them cannot either."""
    advisory = next(a for a in committed() if a["database_specific"]["scenario"] == "S9-identity-resume"
                    and a["database_specific"]["setup_keys"] == [{"adapter": "lora", "engine": "fsdp2"}])  # fmt: skip
    first = advisory["database_specific"]["evidence"][0]["events"][0]
    assert first.get("bound") == "earliest measured"
    assert advisory["affected"][0]["ranges"][0]["events"][0] == {"introduced": "0"}
    found = audit.judge(advisory, {"accelerate": "1.12.0", "transformers": "5.14.1"}, {"engine": "fsdp2"})
    assert found is not None and found.state == "undecided" and "older than 1.13.0" in found.why
    assert audit.judge(advisory, {"accelerate": "1.14.0"}, {"engine": "fsdp2"}).state == "applies"


def test_a_setup_that_already_has_the_measured_fix_is_cleared(tmp_path: Path) -> None:
    """SHARDED_STATE_DICT passed where the FSDP2 resume baseline failed (accelerate 1.14.0): a config that declares
    it is not affected; one that declares FULL_STATE_DICT (which failed there too) is."""
    sharded = FSDP.format(v=2) + "  fsdp_state_dict_type: SHARDED_STATE_DICT\n"
    full = FSDP.format(v=2) + "  fsdp_state_dict_type: FULL_STATE_DICT\n"
    states = {}
    for name, text in (("sharded", sharded), ("full", full)):
        (tmp_path / f"{name}.yaml").write_text(text)
        done = _audit(tmp_path, STACK, "--accelerate-config", str(tmp_path / f"{name}.yaml"), "--format", "json")
        states[name] = {f["state"] for f in json.loads(done.stdout) if "S9-identity-resume" in f["summary"]}
    assert states == {"sharded": {"cleared"}, "full": {"applies"}}


def test_a_requirements_file_that_leaves_a_package_out_is_undecided_a_lock_is_not(tmp_path: Path) -> None:
    """torch is often installed apart from a project's requirements: a requirements file without it cannot clear a
    failure torch brings; a lock without it has no torch, and the failure cannot happen."""
    args = ("--setup", "zero3,lora", "--device", "cpu", "--format", "json")
    loose = json.loads(_audit(tmp_path, "deepspeed==0.16.1\n", *args).stdout)
    assert any(f["state"] == "undecided" and "torch is not in your files" in f["why"] for f in loose)
    locked = '[[package]]\nname = "deepspeed"\nversion = "0.16.1"\n'
    assert not any("torch" in f["why"] for f in json.loads(_audit(tmp_path, locked, *args, name="uv.lock").stdout))


def test_a_failure_one_package_brings_and_another_ends_is_one_advisory() -> None:
    """S4 on CPU: torch 2.5.0 brought the ZeRO-3 checkpointing failure and deepspeed 0.19.3 ended it on the same
    configs. One advisory holds both as a conjunction (audit: torch 2.13.0 with deepspeed 0.19.3 is clear, with 0.19.2
    it is not, torch 2.4.1 is clear); OSV's own fields name both packages (any of them), so a tool reading only those
    reports every stack the conjunction reports."""
    s4 = [a for a in committed() if a["database_specific"]["scenario"] == "S4-zero3-lora-checkpoint"
          and a["database_specific"]["device"] == "cpu"]  # fmt: skip
    both = [a for a in s4 if {c["package"] for c in a["database_specific"]["conditions"]} == {"torch", "deepspeed"}]
    assert len(both) == 1
    advisory = both[0]
    configs = set(advisory["database_specific"]["config_ids"])
    assert not [a for a in s4 if a is not advisory and set(a["database_specific"]["config_ids"]) & configs]
    assert audit.judge(advisory, {"torch": "2.13.0", "deepspeed": "0.19.3"}, {}) is None
    assert audit.judge(advisory, {"torch": "2.13.0", "deepspeed": "0.19.2"}, {}).state == "applies"
    assert audit.judge(advisory, {"torch": "2.4.1", "deepspeed": "0.16.1"}, {}) is None
    for stack in ({"torch": "2.13.0", "deepspeed": "0.19.2"}, {"torch": "2.11.0", "deepspeed": "0.16.1"}):
        assert any(audit.affected(e["ranges"][0]["events"], stack[e["package"]["name"]]) for e in advisory["affected"])
