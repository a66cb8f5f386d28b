"""The gate as users meet it: every file users have, read as the tools that write it read it
(`harness/tools/user_files/pins.py`). A corpus of odd and bad files (`tests/audit_inputs/`, each with the exit and the
words `audit` must give) and Hypothesis fuzzing of each format (real files mutated, random bytes, other encodings):
never a traceback, one line and exit 2 for anything that cannot be read, never an exit 0 or 1 from it; a UTF-16
`pip freeze` is read."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.cli import main
from harness.errors import UsageError
from harness.tools.answers.audit import SCHEMA_FILE, SCHEMA_VERSION
from harness.tools.user_files import pins as user_files
from harness.tools.user_files import user_configs
from harness.tools.user_files.target import target_of
from tests.conftest import REPO_ROOT

CORPUS = REPO_ROOT / "tests" / "audit_inputs"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text())
STACK = "torch==2.11.0\ntransformers==5.14.1\npeft==0.20.0\naccelerate==1.14.0\n"
OPTION = {"accelerate": "--accelerate-config", "deepspeed": "--deepspeed-config", "trainer": "--trainer-config"}


def audit(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["audit", *argv, "--results-dir", str(REPO_ROOT / "results")])
    out, err = capsys.readouterr()
    return code, out, err


def argv_for(name: str, kind: str, tmp_path: Path, args: list[str] | None = None, folder: Path = CORPUS) -> list[str]:
    if kind in OPTION:
        stack = tmp_path / "requirements.txt"
        stack.write_text(STACK)
        return [str(stack), OPTION[kind], str(folder / name), "--gpus", "2", *(args or [])]
    return [str(folder / name), *(args or [])]


@contextmanager
def at_most(seconds: int) -> Iterator[None]:
    """A bound on one run, generous enough that no machine is that slow (a hang, not a slow machine, trips it)."""

    def stop(signum: int, frame: object) -> None:
        raise TimeoutError(f"ran past {seconds} s")

    before = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)


def hostile(folder: Path) -> dict[str, dict[str, Any]]:
    """The hostile inputs too big, too odd or too dangerous to commit, made here: FIFOs (a reader that opens one
    blocks), 100,000-deep JSON, TOML and YAML, a 50 MB requirements file and a 50 MB single line, a lockfile past the
    size limit, a directory, a device, a symlink loop. Each must be one line and exit 2."""
    made: dict[str, dict[str, Any]] = {}

    def entry(name: str, kind: str, says: str) -> None:
        made[name] = {"as": kind, "exit": [2], "says": says}

    for name, kind in (("fifo.txt", "requirements"), ("fifo.uv.lock", "lock"), ("fifo-accelerate.yaml", "accelerate"),
                       ("fifo-ds.json", "deepspeed"), ("fifo-trainer.yaml", "trainer")):  # fmt: skip
        os.mkfifo(folder / name)
        entry(name, kind, "FIFO")
    (folder / "deep.json").write_text('{"zero_optimization": ' + "[" * 100_000 + "]" * 100_000 + "}")
    entry("deep.json", "deepspeed", "nested deeper")
    (folder / "deep.uv.lock").write_text("version = " + "[" * 100_000 + "]" * 100_000 + "\n")
    entry("deep.uv.lock", "lock", "nested deeper")
    (folder / "deep.yaml").write_text("adapter: " + "[" * 100_000 + "]" * 100_000 + "\n")
    entry("deep.yaml", "trainer", "nested deeper")
    (folder / "deep-list.yaml").write_text("distributed_type: " + "- " * 100_000 + "x\n")
    entry("deep-list.yaml", "accelerate", "not an accelerate")
    with (folder / "50mb.txt").open("w") as out:
        out.write("torch==2.4.1\n" * 4_000_000)
    entry("50mb.txt", "requirements", "larger than")
    (folder / "50mb-line.txt").write_text("x" * 50_000_000 + "\n")
    entry("50mb-line.txt", "requirements", "larger than")
    (folder / "past-limit.uv.lock").write_text("#" * (8 * 1024 * 1024 + 1))
    entry("past-limit.uv.lock", "lock", "larger than")
    (folder / "2mb.yaml").write_text("a: 1\n" * 500_000)
    entry("2mb.yaml", "trainer", "larger than")
    (folder / "folder.txt").mkdir()
    entry("folder.txt", "requirements", "a directory")
    (folder / "zero.txt").symlink_to("/dev/zero")
    entry("zero.txt", "requirements", "a device")
    (folder / "loop.txt").symlink_to(folder / "loop.txt")
    entry("loop.txt", "requirements", "loop.txt")
    (folder / "many-lines.txt").write_text("torch==2.4.1\n" + "# c\nx==1\n" * 30_000)
    entry("many-lines.txt", "requirements", "more than 20,000 lines")
    (folder / "spaces.txt").write_text("torch==2.4.1" + " " * 1_000_000 + "x\n")
    entry("spaces.txt", "requirements", "not a requirement")
    return made


def test_the_corpus_is_large_and_every_format_is_in_it(tmp_path: Path) -> None:
    made = hostile(tmp_path)
    assert len(MANIFEST) + len(made) >= 80
    assert {e["as"] for e in MANIFEST.values()} == {"requirements", "lock", "accelerate", "deepspeed", "trainer"}
    assert sum(1 for e in [*MANIFEST.values(), *made.values()] if e["exit"] == [2]) >= 60


def _answer(
    name: str, entry: dict[str, Any], folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> float:
    start = time.monotonic()
    with at_most(60):
        code, out, err = audit(capsys, *argv_for(name, entry["as"], tmp_path, entry.get("args"), folder))
    took = time.monotonic() - start
    assert "Traceback" not in out + err, (name, err[-500:])
    assert code in entry["exit"], (name, code, out[-500:], err)
    if code == 2:
        assert out == "" and len(err.strip().splitlines()) == 1 and len(err) <= 1100, (name, err[:300])
        assert entry["says"] in err, (name, err)
    else:
        assert err == "" and entry["says"] in out, (name, out[-800:])
    return took


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_every_odd_or_bad_file_gets_its_answer(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    entry = MANIFEST[name]
    _answer(name, entry, CORPUS, tmp_path, capsys)
    if entry.get("reads"):
        args = entry.get("args") or []
        target = target_of(
            *(args[args.index(f) + 1] if f in args else None for f in ("--platform", "--python-version"))
        )
        found = user_files.read_pins(CORPUS / name, target)
        assert found.pins.items() >= entry["reads"].items(), (name, found)


def test_every_hostile_input_is_one_line_and_exit_2_in_seconds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "hostile"
    folder.mkdir()
    made = hostile(folder)
    took = {name: _answer(name, entry, folder, tmp_path, capsys) for name, entry in sorted(made.items())}
    print("hostile inputs, seconds each:", ", ".join(f"{n} {t:.2f}" for n, t in took.items()))


def test_every_answer_of_the_corpus_keeps_the_json_contract(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--format json` of every corpus file that is read (exit 0 or 1) validates against audit.schema.json."""
    import jsonschema

    schema = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    checked = 0
    for name, entry in sorted(MANIFEST.items()):
        if 2 in entry["exit"]:
            continue
        code, out, err = audit(capsys, *argv_for(name, entry["as"], tmp_path, entry.get("args")), "--format", "json")
        assert code in (0, 1), (name, err)
        document = json.loads(out)
        errors = sorted(validator.iter_errors(document), key=lambda e: list(e.path))
        assert not errors, (name, [f"{list(e.path)}: {e.message}" for e in errors[:3]])
        assert document["schema_version"] == SCHEMA_VERSION and document["inputs"], name
        checked += 1
    assert checked >= 30, checked


def test_a_config_s_fix_clears_what_it_fixes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """stage3_gather_16bit_weights_on_model_save: true in the user's DeepSpeed JSON clears the ZeRO-3 Trainer save
    failure it fixes (measured passing wherever that failure showed); false leaves it applying."""
    stack = tmp_path / "requirements.txt"
    stack.write_text("torch==2.9.1\ntransformers==4.57.1\npeft==0.18.0\naccelerate==1.11.0\ndeepspeed==0.18.2\n")
    states = {}
    for gather in ("true", "false"):
        config = tmp_path / f"ds-{gather}.json"
        config.write_text(json.dumps({"zero_optimization": {"stage": 3,
                                      "stage3_gather_16bit_weights_on_model_save": gather == "true"}}))  # fmt: skip
        _, out, _ = audit(capsys, str(stack), "--deepspeed-config", str(config), "--setup", "trainer,lora",
                             "--gpus", "0", "--format", "json")  # fmt: skip
        found = json.loads(out)["answers"]
        states[gather] = {a["state"] for a in found if a["scenario"] == "S7-saved-adapter" and "ZeRO-3" in a["when"]}
    assert "cleared" in states["true"] and "applies" not in states["true"], states
    assert "applies" in states["false"], states


def test_num_processes_is_the_gpu_count_and_a_trainer_config_names_the_setup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    accelerate = user_configs.read_accelerate(CORPUS / "acc-fsdp2-sharded.yaml")
    assert accelerate.gpus == 2 and accelerate.setup == {
        "precision": "bf16", "engine": "fsdp2", "state_dict": "sharded_state_dict"
    }  # fmt: skip
    followed = user_configs.read_accelerate(CORPUS / "acc-deepspeed-file.yaml")
    assert followed.setup == {"engine": "zero3", "zero3_gather_16bit": "true"} and followed.gpus == 2
    trainer = user_configs.read_trainer(CORPUS / "trainer-axolotl.yaml")
    assert trainer.setup == {"loop": "trainer", "engine": "fsdp2", "use_reentrant": "false", "adapter": "qlora"}
    # No FSDP version given: transformers' own default for the pinned release (FSDP2 from 5.0).
    bare = tmp_path / "trainer.yaml"
    bare.write_text("fsdp: full_shard auto_wrap\nper_device_train_batch_size: 1\n")
    assert user_configs.read_trainer(bare, {"transformers": "5.14.1"}).setup["engine"] == "fsdp2"
    assert user_configs.read_trainer(bare, {"transformers": "4.57.1"}).setup["engine"] == "fsdp1"


def test_an_environment_without_the_packages_is_no_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--python` of an interpreter that has none of torch, transformers, peft, ... (a fresh venv): exit 2 with one
    line, not a clean gate."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    code, out, err = audit(capsys, "--python", str(tmp_path / "venv" / "bin" / "python"))
    assert code == 2 and out == "" and "nothing to judge" in err and len(err.strip().splitlines()) == 1, err


#: Real files of each format, as the tools write them: what the fuzzing mutates.
SEEDS = {
    "requirements.txt": (CORPUS / "markers-linux-win.txt").read_bytes() + (CORPUS / "hash-same-line.txt").read_bytes(),
    "freeze.txt": (CORPUS / "windows-freeze.txt").read_bytes().decode("utf-16").encode(),
    "uv.lock": (CORPUS / "uv-forked.uv.lock").read_bytes(),
    "pylock.toml": (CORPUS / "marker-entry.pylock.toml").read_bytes(),
    "poetry.lock": (CORPUS / "good.poetry.lock").read_bytes(),
    "environment.yml": (CORPUS / "environment.yml").read_bytes(),
    "accelerate.yaml": (CORPUS / "acc-fsdp2-sharded.yaml").read_bytes(),
    "deepspeed.json": (CORPUS / "ds-name.json").read_bytes(),
    "trainer.yaml": (CORPUS / "axolotl-fsdp2-top.yaml").read_bytes() + b"deepspeed:\n",
}
KINDS = {"accelerate.yaml": "accelerate", "deepspeed.json": "deepspeed", "trainer.yaml": "trainer"}
READERS = {name: user_files.read_pins for name in SEEDS} | {
    "accelerate.yaml": user_configs.read_accelerate,
    "deepspeed.json": user_configs.read_deepspeed,
    "trainer.yaml": user_configs.read_trainer,
}


@st.composite
def mutated(draw: st.DrawFn, name: str) -> bytes:
    """A format's real file with bytes flipped, cut, inserted, repeated or re-encoded, or random bytes."""
    data = bytearray(SEEDS[name])
    how = draw(st.sampled_from(["flip", "cut", "insert", "repeat", "utf16", "bom", "random"]))
    if how == "random":
        return draw(st.binary(max_size=300))
    if how == "utf16":
        return b"\xff\xfe" + bytes(data).decode().encode("utf-16-le")
    if how == "bom":
        return b"\xef\xbb\xbf" + bytes(data)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if how == "flip" and data:
            data[at] = draw(st.integers(0, 255))
        elif how == "cut":
            del data[at:]
        elif how == "repeat":  # a piece of the file many times over: nesting, aliases, long lines
            piece = bytes(data[at : at + draw(st.integers(1, 12))])
            data[at:at] = piece * draw(st.integers(2, 3000))
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
    return bytes(data)


@pytest.mark.parametrize("name", sorted(SEEDS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_no_file_breaks_the_gate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, data: st.DataObject
) -> None:
    """Whatever the bytes of each format: no traceback and an exit of 0, 1 or 2, within a bound no machine is slow
    enough to reach (a hang trips it); exit 2 with one line exactly where the reader refuses the file, else the
    judge's 0 or 1."""
    path = tmp_path / name
    path.write_bytes(data.draw(mutated(name)))
    with at_most(60):
        try:
            READERS[name](path)
            readable = True
        except UsageError:
            readable = False
        kind = KINDS.get(name, "requirements")
        code, out, err = audit(capsys, *argv_for(name, kind, tmp_path, folder=tmp_path))
    assert "Traceback" not in out + err and code in (0, 1, 2), (name, err[-300:])
    if readable:
        assert code in (0, 1), (name, err)
    else:
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (name, err)


def test_an_environment_s_answer_keeps_the_json_contract(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--python` of an environment (its installed distributions, as importlib.metadata lists them) in JSON: one input
    of kind environment, a complete one, valid against the schema."""
    import subprocess
    import sys

    import jsonschema

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    python = tmp_path / "venv" / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    for name, version in (("torch", "2.11.0"), ("peft", "0.20.0")):
        info = Path(site) / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    code, out, err = audit(capsys, "--python", str(python), "--format", "json")
    assert code in (0, 1), err
    document = json.loads(out)
    jsonschema.validate(document, json.loads(SCHEMA_FILE.read_text()))
    (read,) = document["inputs"]
    assert read["kind"] == "environment" and read["complete"], read
    assert {p["name"]: p["version"] for p in read["packages"]} == {"torch": "2.11.0", "peft": "0.20.0"}


def test_a_hook_on_a_file_unrelated_to_the_stack_says_so_and_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file naming none of the judged packages is bad input for the gate (exit 2); the pre-commit hook passes
    --unrelated-ok (its entry), so a commit of requirements-dev.txt says so in one line and passes."""
    dev = tmp_path / "requirements-dev.txt"
    dev.write_text("pytest==8.3.3\nruff==0.8.0\n")
    code, out, err = audit(capsys, str(dev))
    assert code == 2 and "nothing to judge" in err and out == "", err
    code, out, err = audit(capsys, str(dev), "--unrelated-ok")
    assert code == 0 and out == "" and len(err.strip().splitlines()) == 1 and "nothing to judge" in err, err
    code, _, _ = audit(capsys, str(dev), str(CORPUS / "include-ok.txt"), "--unrelated-ok")
    assert code == 1  # a stack beside it is judged as ever
    hook = (REPO_ROOT / ".pre-commit-hooks.yaml").read_text()
    assert "entry: compat-matrix audit --unrelated-ok" in hook
