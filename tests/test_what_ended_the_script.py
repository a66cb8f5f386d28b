"""A script's failure is what ended it (issue 61): its uncaught exception or its `sys.exit` message, never a traceback a
library printed and went past; a failure later in the script is evidence that an earlier one is gone; what this
machine cannot load is said as such. Real runs of small scripts with this interpreter (the runner and the probe as
`bisect-script` starts them), and a real bisect over packaging's releases."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from harness.execution.script_launch import run_script

#: A library that cannot load its native part on this machine: it prints the traceback it caught, and goes on.
FAKELIB = textwrap.dedent(
    """
    import traceback

    try:
        raise OSError(
            "/lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.32' not found "
            "(required by /opt/site-packages/fakelib/libfake_cpu.so)"
        )
    except OSError:
        traceback.print_exc()
    """
)

EXITS_WITH_ITS_OWN_MESSAGE = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "site-packages"))
    import fakelib  # prints a caught traceback, as bitsandbytes does where its CPU library cannot load

    difference = 0.158
    if difference > 1e-3:
        sys.exit(f"merged model differs from the adapter model: max abs logits difference {difference}")
    """
)


def _script(tmp_path: Path, text: str, name: str = "user_script.py") -> Path:
    library = tmp_path / "site-packages" / "fakelib"
    library.mkdir(parents=True, exist_ok=True)
    (library / "__init__.py").write_text(FAKELIB)
    script = tmp_path / name
    script.write_text(text)
    return script


def test_the_failure_is_the_scripts_own_exit_message_not_a_printed_traceback(tmp_path: Path) -> None:
    run = run_script(Path(sys.executable), _script(tmp_path, EXITS_WITH_ITS_OWN_MESSAGE), timeout_s=120)
    assert run.outcome == "fail" and run.exit_code == 1
    assert run.error == "merged model differs from the adapter model: max abs logits difference 0.158"
    assert run.signature.startswith("exit-1-") and run.traceback == ""
    assert run.ended == "exit" and run.script_lines == [10]  # the sys.exit line of the script
    assert any(note.startswith("OSError: /lib/x86_64-linux-gnu/libstdc++.so.6") for note in run.notes)
    assert run.machine_limits == ["fakelib could not load its native library here (GLIBCXX_3.4.32)"]


def test_an_uncaught_exception_is_the_failure_with_the_scripts_own_line(tmp_path: Path) -> None:
    text = EXITS_WITH_ITS_OWN_MESSAGE.replace(
        'sys.exit(f"merged model differs', 'raise TypeError(f"merged model differs'
    )
    run = run_script(Path(sys.executable), _script(tmp_path, text), timeout_s=120)
    assert run.error.startswith("TypeError: merged model differs") and run.ended == "exception"
    assert run.script_lines == [10] and run.notes and run.signature.startswith("unclassified-TypeError")


def test_a_stack_whose_only_failure_is_a_native_library_that_cannot_load_is_unusable(tmp_path: Path) -> None:
    """The machine's limit is never the failure asked about: the run is unusable for the search, with the reason."""
    from harness.define.profile import load_profile
    from harness.environments.envs import InstallOptions
    from harness.paths import MATRIX_DIR
    from harness.tools.script_verdicts.script_bisect import ScriptBisect
    from harness.tools.script_verdicts.stack_run import StackRun

    text = 'raise OSError("libfoo.so.1: cannot open shared object file: No such file or directory")\n'
    run = run_script(Path(sys.executable), _script(tmp_path, text), timeout_s=120)
    assert run.signature == "native-library-cannot-load", run
    bisect = ScriptBisect(_script(tmp_path, text), tmp_path / "out", load_profile("history", MATRIX_DIR),
                          InstallOptions(envs_dir=tmp_path / "envs"))  # fmt: skip
    found = StackRun.of("scan", "here", run, {"versions": {}}, "k")
    assert bisect.state_of(found) == "unusable"


EARLY_THEN_LATER = textwrap.dedent(
    '''
    # /// script
    # dependencies = ["packaging"]
    # ///
    """A keyword error early on packaging before 21 (line 12), a check that fails later before 23 (line 20)."""
    import packaging

    major = int(packaging.__version__.split(".")[0])


    if major < 21:
        raise TypeError("LoraConfig.__init__() got an unexpected keyword argument 'lora_bias'")
    # ... the script's work, which the older releases never reach ...
    result = major * 2




    if major < 23:
        raise SystemExit("merged model differs from the adapter model")
    print("fine")
    '''
)


def test_a_failure_later_in_the_script_is_evidence_that_the_earlier_one_is_gone(tmp_path: Path) -> None:
    """20.0 fails early (the keyword error), 22.0 later (the merge check), 23.0 passes: the keyword error's end is the
    first release that gets past it (21.0, where the later failure takes over), not the first that passes."""
    from harness.define.profile import load_profile
    from harness.environments.envs import InstallOptions, default_envs_dir
    from harness.paths import MATRIX_DIR
    from harness.tools.script_verdicts.script_bisect import End, ScriptBisect, run, summary_lines

    script = tmp_path / "early_then_later.py"
    script.write_text(EARLY_THEN_LATER)
    said: list[str] = []
    bisect = ScriptBisect(script, tmp_path / "out", load_profile("history", MATRIX_DIR),
                          InstallOptions(envs_dir=default_envs_dir()), say=said.append)  # fmt: skip
    verdict = run(bisect, [End(pins={"packaging": v}) for v in ("20.0", "22.0", "23.0")], None)
    assert verdict["target"]["error"] == "merged model differs from the adapter model"
    (asked,) = verdict["flips"]
    assert (asked["direction"], asked["first_release"], asked["last_release_before"]) == ("ended", "23.0", "22.0")
    (early,) = [f for f in verdict["different_failures"] if "lora_bias" in (f["error"] or "")]
    (answer,) = early["flips"]
    assert (answer["direction"], answer["first_release"]) == ("ended", "21.0"), answer
    assert answer["last_release_before"].startswith("20.")
    assert "later in the script, takes over" in answer["note"]
    scan = next(line for line in summary_lines(verdict) if line.strip().startswith("scan:"))
    assert "packaging==22.0:target" in scan


def test_no_committed_verdict_asks_about_what_this_machine_cannot_load() -> None:
    """The committed verdicts re-judged: no failure asked about, and no issue title, is a native library this machine
    cannot load (a traceback bitsandbytes prints and goes past). Runs made with the runner also say what ended them:
    where they do, the failure asked about is that."""
    import json

    from scenarios.failure_names import NATIVE_LOAD

    root = Path(__file__).resolve().parents[1] / "results" / "script-bisect"
    checked = ended = 0
    for path in sorted(root.glob("*/verdict.json")):
        verdict = json.loads(path.read_text())
        target = verdict["target"]
        if not target.get("error"):
            continue
        assert not NATIVE_LOAD.search(target["error"]), path
        issue = path.parent / "issue.md"
        title = issue.read_text().splitlines()[1] if issue.is_file() else ""
        assert not NATIVE_LOAD.search(title) and "GLIBCXX" not in title, path
        runs = [json.loads(line) for line in (path.parent / "runs.jsonl").read_text().splitlines() if line.strip()]
        for found in (r for r in runs if r.get("ended") and r.get("signature") == target["signature"]):
            assert found["ended"] in ("exception", "exit"), (path, found["label"])
            ended += 1
        checked += 1
    assert checked >= 8
    assert ended >= 1, "a committed verdict made with the runner"


def test_a_dated_cell_never_takes_a_local_wheel_through_uvs_own_variable() -> None:
    """UV_FIND_LINKS is read by uv itself; a local wheel has no upload date, so a dated stack would take it (a
    2025-07-04 environment got the machine's torch 2.13.0+cpu): dated builds run without it, others keep it."""
    from harness.environments.envs import uv_environ

    base = {"UV_FIND_LINKS": "/opt/wheels", "HOME": "/root"}
    assert "UV_FIND_LINKS" not in uv_environ(True, base) and uv_environ(True, base)["HOME"] == "/root"
    assert uv_environ(False, base)["UV_FIND_LINKS"] == "/opt/wheels"


#: A library as bitsandbytes is on a CPU machine whose libstdc++ is too old: on import it warns through `logging` that
#: it was compiled without GPU support (and that its CUDA binary is not found), then logs the traceback of the native
#: library it could not load (caught, with `exc_info`), so the process's stderr ends with that traceback whatever the
#: script does next.
NOISY_LIBRARY = textwrap.dedent(
    """
    import logging

    logger = logging.getLogger("noisylib")
    logger.warning(
        "The installed version of noisylib was compiled without GPU support. 8-bit optimizers and GPU quantization "
        "are unavailable."
    )
    logger.warning("Configured CUDA binary not found at /opt/site-packages/noisylib/libbitsandbytes_cuda130.so")
    try:
        raise OSError(
            "/lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.32' not found "
            "(required by /opt/site-packages/noisylib/libnoisy_cpu.so)"
        )
    except OSError as error:
        logger.error("Could not load noisylib native library: %s", error, exc_info=True)
    """
)
FAILS_ON_ITS_OWN_LINE = textwrap.dedent(
    """
    import sys

    import noisylib  # noqa: F401


    def main():
        print("comparing the merged model with the adapter model")
        print("FAIL: RuntimeError: merged model differs from the adapter model by 0.216")
        return 1


    if __name__ == "__main__":
        sys.exit(main())
    """
)
#: The same, with the library imported by a child process the script starts after its own line (the child's output
#: on the inherited streams, last).
CHILD_IMPORTS_IT = textwrap.dedent(
    """
    import subprocess
    import sys

    print("FAIL: the adapter saved here does not load in a fresh process", file=sys.stderr)
    child = subprocess.run([sys.executable, "-c", "import noisylib"])
    sys.exit(1)
    """
)


def _noisy(tmp_path: Path, text: str) -> tuple[Path, str]:
    """The script, and the site holding the library (installed as a package is: first on the run's PYTHONPATH)."""
    site = tmp_path / "site"
    (site / "noisylib").mkdir(parents=True, exist_ok=True)
    (site / "noisylib" / "__init__.py").write_text(NOISY_LIBRARY)
    script = tmp_path / "user_script.py"
    script.write_text(text)
    return script, str(site)


def test_a_library_warning_or_caught_traceback_is_never_what_ended_the_script(tmp_path: Path) -> None:
    """A plain non-zero exit is named by the last line the script itself printed (stdout here), never by the
    library's warning on import nor by the traceback it caught, printed and went past (which ends stderr); that
    traceback is a note and the machine's limit, and the run is the failure, never unusable: the script went on past
    the library's import to its own end."""
    from harness.define.profile import load_profile
    from harness.environments.envs import InstallOptions
    from harness.paths import MATRIX_DIR
    from harness.tools.script_verdicts.script_bisect import ScriptBisect
    from harness.tools.script_verdicts.stack_run import StackRun

    script, site = _noisy(tmp_path, FAILS_ON_ITS_OWN_LINE)
    run = run_script(Path(sys.executable), script, timeout_s=120, pythonpath=site)
    assert run.stderr_tail.rstrip().endswith("libnoisy_cpu.so)"), run.stderr_tail  # stderr ends with the traceback
    bisect = ScriptBisect(script, tmp_path / "out", load_profile("history", MATRIX_DIR),
                          InstallOptions(envs_dir=tmp_path / "envs"))  # fmt: skip
    found = StackRun.of("scan", "here", run, {"versions": {}}, "k")
    bisect.target = run.signature
    assert bisect.state_of(found) == "target", (run.error, run.signature)  # never "unusable"
    assert run.outcome == "fail" and run.ended == "exit", run
    assert run.error == "FAIL: RuntimeError: merged model differs from the adapter model by 0.216", run.error
    assert run.signature.startswith("exit-1-") and "GLIBCXX" not in (run.error_text or ""), run
    assert run.machine_limits == ["noisylib could not load its native library here (GLIBCXX_3.4.32)"]


def test_a_child_process_that_prints_a_librarys_traceback_does_not_name_the_failure(tmp_path: Path) -> None:
    """The script's child imports the library (its warning and traceback go to the streams it inherited); the script
    printed its own line on stderr before, and exits 1: that line names the failure."""
    script, site = _noisy(tmp_path, CHILD_IMPORTS_IT)
    run = run_script(Path(sys.executable), script, timeout_s=120, pythonpath=site)
    assert "compiled without GPU support" in run.stderr_tail and "GLIBCXX" in run.stderr_tail, run.stderr_tail
    assert run.error == "FAIL: the adapter saved here does not load in a fresh process", run.error


def test_a_script_that_passes_past_a_librarys_traceback_passes(tmp_path: Path) -> None:
    script, site = _noisy(tmp_path, "import noisylib  # noqa: F401\nprint('fine')\n")
    run = run_script(Path(sys.executable), script, timeout_s=120, pythonpath=site)
    assert run.outcome == "pass" and run.ended == "end" and run.machine_limits, run


def test_a_script_that_prints_nothing_of_its_own_is_named_by_its_exit_code_not_a_librarys_line(tmp_path: Path) -> None:
    script, site = _noisy(tmp_path, "import sys\nimport noisylib  # noqa: F401\nsys.exit(3)\n")
    run = run_script(Path(sys.executable), script, timeout_s=120, pythonpath=site)
    assert run.exit_code == 3 and run.error == "exit code 3: the script printed no line of its own", run.error
    assert run.signature == "crash-exit-3", run.signature
