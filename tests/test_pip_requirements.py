"""Requirements files read as pip reads them (`tools/user_files/pip_requirements.py`), held to pip's own parser (pip's
`req_file.parse_requirements` and `install_req_from_parsed_requirement`, installed here with the test tools), and the
page's reader (`site_read.js`) held to Python on the same texts and targets: written cases of every form pip's grammar
has (continuations, comments, options, `--hash` on the line, markers, extras, URLs, wheels, sdists, editables) and
files Hypothesis writes from that grammar. Markers are read for a target: the order of lines and the platform of the
machine reading the file change nothing but what the markers say."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.errors import UsageError
from harness.tools.user_files.pins import read_all, read_file
from harness.tools.user_files.pip_requirements import read_requirements
from harness.tools.user_files.target import Target, target_of
from tests.conftest import REPO_ROOT, run_node

SITE_READ = REPO_ROOT / "harness" / "publishing" / "site_read.js"
TARGETS = [Target("linux", "x86_64", "3.11"), Target("windows", "AMD64", "3.12"), Target("macos", "arm64", "3.9"),
           Target("linux", "aarch64", "3.13.1")]  # fmt: skip

#: Every form of pip's grammar, one file each (what pip's own parser reads them as is the expected answer).
CASES = {
    "pins": "torch==2.4.1\ntransformers==4.46.0\npeft==0.13.0\n",
    "comments": "# a comment\ntorch==2.4.1  # pinned\n   # indented comment\npeft==0.13.0 #no space\n",
    "hash-on-line": "torch==2.4.1 --hash=sha256:abcd\npeft==0.13.0 --hash sha256:1234 --hash=sha256:5678\n",
    "hash-continued": "torch==2.4.1 \\\n    --hash=sha256:abc \\\n    --hash=sha256:def\n"
    "    # via -r requirements.in\npeft==0.13.0\n",
    "marker-continued": "peft==0.13.0 \\\n    ; python_version >= '3.8'\ntorch==2.4.1\n",
    "split-name": "acc\\\nelerate==1.0.0\ntorch==2.4.1\n",
    "markers": 'torch==2.4.1; sys_platform == "linux"\ntorch==2.6.0; sys_platform == "win32"\n'
    'torch==2.5.1; sys_platform == "darwin"\npeft==0.13.0 ; python_version < "3.10"\n'
    'peft==0.14.0; python_version >= "3.10"\n',
    "machine-markers": "torch==2.4.1 ; platform_machine == 'x86_64' or platform_machine == 'AMD64'\n"
    "torch==2.5.1 ; platform_machine == 'aarch64' or platform_machine == 'arm64'\n",
    "marker-forms": "torch==2.4.1; 'linux' in sys_platform and (python_full_version >= '3.9.0' or os_name == 'nt')\n"
    "peft==0.13.0; platform_system != 'Windows'\npeft==0.14.0; platform_system == 'Windows'\n",
    "options": "--index-url https://pypi.org/simple\n-i https://pypi.org/simple\n--extra-index-url https://x/simple\n"
    "--pre\n--prefer-binary\n-f https://x/links\n--trusted-host x\n--only-binary :all:\n--no-binary fred\n"
    "--require-hashes\ntorch==2.4.1\n",
    "extras": "transformers[torch,sentencepiece]==4.46.0\npeft[test] >= 0.13, < 0.15\n",
    "parens": "transformers (==4.46.0)\npeft (>=0.13,<0.15)\n",
    "loose": "transformers>=4.41,<=4.45.2\npeft~=0.12.0\ntorch\n",
    "url-sdist": "deepspeed @ https://files.pythonhosted.org/packages/aa/deepspeed-0.15.4.tar.gz\ntorch==2.4.1\n",
    "url-wheel": "https://example.com/w/bitsandbytes-0.45.0-py3-none-manylinux_2_24_x86_64.whl\ntorch==2.4.1\n",
    "named-wheel": "bitsandbytes @ https://example.com/bitsandbytes-0.45.0-py3-none-any.whl\ntorch==2.4.1\n",
    "url-marker": "https://example.com/torch-2.4.1-cp311-cp311-linux_x86_64.whl; sys_platform == 'linux'\n"
    "https://example.com/torch-2.4.1-cp311-cp311-win_amd64.whl; sys_platform == 'win32'\n",
    "git": "git+https://github.com/huggingface/peft@main#egg=peft\ntorch==2.4.1\n",
    "editable": "-e git+https://github.com/huggingface/peft.git#egg=peft\n-e .\ntorch==2.4.1\n",
    "triple-equals": "torch===2.4.1+cu121\npeft==0.13.*\n",
    "local-version": "torch==2.4.1+cpu\ntorchvision==0.19.1+cpu\n",
    "crlf": "torch==2.4.1\r\npeft==0.13.0\r\n",
    "blank-and-spaces": "\n\n   torch==2.4.1   \n\t\npeft==0.13.0\n",
    "conda-freeze": "accelerate==1.0.1\nfilelock==3.16.1\npeft @ file:///croot/peft_1/work\n"
    "torch @ file:///croot/pytorch_1700000000/work\ntyping_extensions==4.12.2\n",
    "freeze": "accelerate==1.0.1\nfilelock==3.16.1\nfsspec==2024.10.0\nhuggingface-hub==0.26.2\njinja2==3.1.4\n"
    "networkx==3.4.2\nnumpy==2.1.3\npeft==0.13.2\npsutil==6.1.0\npyyaml==6.0.2\nregex==2024.11.6\nsafetensors==0.4.5\n"
    "sympy==1.13.1\ntokenizers==0.20.3\ntorch==2.4.1\ntqdm==4.67.0\ntransformers==4.46.3\ntyping_extensions==4.12.2\n",
}
#: What pip refuses, and so does the reader (one line, exit 2 from `audit`).
BAD = {
    "unknown-option": "torch==2.4.1 --frobnicate\n",
    "bad-operator": "torch=2.4.1\n",
    "bad-marker": "torch==2.4.1; sys_platform = 'linux'\n",
    "bad-wheel": "https://example.com/torch.whl\n",
    "no-value": "torch==2.4.1 --hash\n",
    "open-quote": "torch==2.4.1 --hash='sha256:abc\n",
}


def pip_reads(path: Path, environment: dict[str, str]) -> list[dict[str, Any]]:
    """pip's own reading of a requirements file: each requirement's name, specifier, marker (and whether it holds on
    the target), URL, editable."""
    from pip._internal.network.session import PipSession
    from pip._internal.req.constructors import install_req_from_parsed_requirement
    from pip._internal.req.req_file import parse_requirements

    found = []
    for parsed in parse_requirements(str(path), session=PipSession()):
        ireq = install_req_from_parsed_requirement(parsed)
        name = ireq.req.name if ireq.req is not None else None
        marker = str(ireq.markers) if ireq.markers is not None else None
        found.append({
            "name": name and name.lower().replace("_", "-").replace(".", "-"),
            "specifier": str(ireq.req.specifier) if ireq.req is not None else "",
            "holds": ireq.markers.evaluate(environment | {"extra": ""}) if ireq.markers is not None else True,
            "marker": marker is not None,
            "url": (ireq.link.url if ireq.link else None) is not None,
            "editable": ireq.editable,
        })  # fmt: skip
    return found


def ours(path: Path, environment: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": line.name, "specifier": str(line.specifier) if not (line.url and not line.named_by) else "",
             "holds": line.holds, "marker": line.marker is not None, "url": line.url is not None,
             "editable": line.editable} for line in read_requirements(path, environment).lines]  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_form_reads_as_pip_reads_it(name: str, tmp_path: Path) -> None:
    path = tmp_path / "requirements.txt"
    path.write_text(CASES[name], newline="")
    for target in TARGETS:
        environment = target.environment()
        theirs = [r for r in pip_reads(path, environment) if r["name"] is not None or r["url"]]
        mine = ours(path, environment)
        for entry in theirs + mine:  # a name pip learns only by building (an sdist, -e .): compared as unnamed
            if entry["url"] and (entry["name"] is None or name in ("git", "editable", "url-sdist")):
                entry["name"] = entry["specifier"] = None
        assert mine == theirs, (name, target)


@pytest.mark.parametrize("name", sorted(BAD))
def test_what_pip_refuses_is_refused(name: str, tmp_path: Path) -> None:
    from pip._internal.exceptions import InstallationError, RequirementsFileParseError

    path = tmp_path / "requirements.txt"
    path.write_text(BAD[name])
    with pytest.raises((InstallationError, RequirementsFileParseError, ValueError, Exception)):
        pip_reads(path, TARGETS[0].environment())
    with pytest.raises(UsageError):
        read_file(path, TARGETS[0])


def test_markers_pick_the_release_of_each_target_and_line_order_changes_nothing(tmp_path: Path) -> None:
    """The issue's case: torch 2.4.1 on Linux, 2.6.0 on Windows, whatever line comes last."""
    lines = CASES["markers"].splitlines()
    expected = {"linux": "2.4.1", "windows": "2.6.0", "macos": "2.5.1"}
    rng = random.Random(74)
    for _ in range(6):
        rng.shuffle(lines)
        path = tmp_path / "requirements.txt"
        path.write_text("\n".join(lines) + "\n")
        for system, release in expected.items():
            found = read_all([path], target_of(system, "3.11"))
            assert found.pins["torch"] == release and found.pins["peft"] == "0.14.0", (lines, system)
        assert read_all([path], target_of("linux", "3.9")).pins["peft"] == "0.13.0"


def test_a_freeze_is_a_complete_environment_and_a_hand_list_is_not(tmp_path: Path) -> None:
    freeze = tmp_path / "freeze.txt"
    freeze.write_text(CASES["freeze"])
    read = read_file(freeze, TARGETS[0])
    assert read.complete and read.kind == "requirements", read
    assert read.as_json()["not_installed"] == ["bitsandbytes", "deepspeed"]
    hand = tmp_path / "requirements.txt"
    hand.write_text(CASES["pins"])
    assert not read_file(hand, TARGETS[0]).complete
    # a conda environment's freeze names torch by where it was built: torch is there, its release unknown, so the
    # file says nothing of what is not installed
    conda = tmp_path / "conda-freeze.txt"
    conda.write_text(CASES["freeze"].replace("torch==2.4.1", "torch @ file:///croot/pytorch_1700000000/work"))
    found = read_file(conda, TARGETS[0])
    assert not found.complete and "torch" not in found.pins and found.unnamed, found


def test_two_releases_for_one_machine_is_an_error_naming_both(tmp_path: Path) -> None:
    path = tmp_path / "requirements.txt"
    path.write_text("torch==2.4.1\npeft==0.13.0\ntorch==2.6.0\n")
    with pytest.raises(UsageError, match=r"requirements.txt:3: torch 2.6.0, and torch 2.4.1 at requirements.txt:1"):
        read_file(path, TARGETS[0])
    one, two = tmp_path / "a.txt", tmp_path / "b.txt"
    one.write_text("torch==2.4.1\n")
    two.write_text("torch==2.6.0\npeft==0.13.0\n")
    for order in ([one, two], [two, one]):
        with pytest.raises(UsageError, match=r"torch .* the files disagree") as caught:
            read_all(order, TARGETS[0])
        assert "a.txt" in str(caught.value) and "b.txt" in str(caught.value)
    outside = tmp_path / "c.txt"
    outside.write_text("torch>=2.5\n")
    with pytest.raises(UsageError, match=r"excludes torch 2\.4\.1"):
        read_all([one, outside], TARGETS[0])


def test_url_requirements_are_judged_at_their_file_name_s_release(tmp_path: Path) -> None:
    path = tmp_path / "requirements.txt"
    path.write_text(CASES["url-sdist"] + CASES["url-wheel"].splitlines()[0] + "\n")
    found = read_file(path, TARGETS[0])
    assert found.pins == {"deepspeed": "0.15.4", "torch": "2.4.1", "bitsandbytes": "0.45.0"}, found
    assert not found.loose


# --- the page's reader, held to Python's -----------------------------------------------------------------------


def python_side(tmp_path: Path, text: str, target: Target) -> dict[str, Any]:
    path = tmp_path / "requirements.txt"
    path.write_text(text, newline="")
    try:
        found = read_all([path], target)
    except UsageError:
        return {"refused": True}
    one = found.files[0]
    return {"pins": one.pins, "loose": sorted(one.loose), "unnamed": len(one.unnamed), "complete": one.complete}


def node_side(tmp_path: Path, cases: list[tuple[str, Target]]) -> list[dict[str, Any]]:
    (tmp_path / "cases.json").write_text(json.dumps([[t, x.__dict__] for t, x in cases]))
    script = (
        "const r = require(process.argv[1]); const cases = require(process.argv[2]);"
        "process.stdout.write(JSON.stringify(cases.map(([text, target]) => {"
        " try { const x = r.readPins(text, null, target);"
        "   return { pins: x.pins, loose: x.loose.slice().sort(), unnamed: x.unnamed.length, complete: x.complete }; }"
        " catch (e) { return { refused: true }; } })));"
    )
    return run_node(script, str(SITE_READ), str(tmp_path / "cases.json"), timeout=300)


def test_the_page_reads_every_form_as_audit_does(tmp_path: Path) -> None:
    cases = [(text, target) for text in [*CASES.values(), *BAD.values()] for target in TARGETS]
    expected = [python_side(tmp_path, text, target) for text, target in cases]
    assert node_side(tmp_path, cases) == expected


NAMES = st.sampled_from(["torch", "transformers", "peft", "accelerate", "deepspeed", "bitsandbytes", "numpy",
                         "filelock", "Typing_Extensions", "huggingface.hub"])  # fmt: skip
VERSIONS = st.sampled_from(["2.4.1", "2.6.0", "0.13.0", "4.46.0", "1.0", "2.5.0rc1", "1.2.3.post1", "2.4.1+cu121"])
MARKERS = st.sampled_from(["", "; sys_platform == 'linux'", '; sys_platform == "win32"', "; python_version < '3.12'",
                           "; platform_machine == 'aarch64'", " ; os_name == 'nt' or python_version >= '3.13'",
                           "; platform_system != 'Darwin' and python_full_version >= '3.10.0'",
                           "; 'linux' in sys_platform", "; extra == 'cpu'", "; python_version ~= '3.11'"])  # fmt: skip


@st.composite
def requirement_lines(draw: st.DrawFn) -> str:
    name = draw(NAMES)
    kind = draw(st.sampled_from(["pin", "range", "bare", "url", "wheel", "hash", "continued", "comment", "option"]))
    version = draw(VERSIONS)
    marker = draw(MARKERS)
    if kind == "pin":
        return f"{name}=={version}{marker}"
    if kind == "range":
        return f"{name}{draw(st.sampled_from(['>=', '<=', '~=', '!=', '<', '>']))}{version.split('+')[0]}{marker}"
    if kind == "bare":
        return f"{name}{marker}"
    if kind == "url":
        return f"{name} @ https://example.com/{name.lower()}-{version.split('+')[0]}.tar.gz{marker}"
    if kind == "wheel":
        return f"https://example.com/{name.replace('-', '_').replace('.', '_')}-{version}-py3-none-any.whl"
    if kind == "hash":
        return f"{name}=={version} --hash=sha256:{draw(st.text('0123456789abcdef', min_size=4, max_size=8))}{marker}"
    if kind == "continued":
        return f"{name}=={version} \\\n    --hash=sha256:abcd \\\n    {marker.strip() or '--hash=sha256:ef'}"
    if kind == "comment":
        return f"{name}=={version}{marker}  # {draw(st.text('abc #', max_size=6))}"
    return draw(st.sampled_from(["--index-url https://pypi.org/simple", "--pre", "-f ./wheels", "--only-binary=:all:"]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(requirement_lines(), min_size=1, max_size=8), min_size=10, max_size=10))
def test_files_hypothesis_writes_are_read_alike_by_pip_python_and_the_page(
    tmp_path: Path, files: list[list[str]]
) -> None:
    cases = [("\n".join(lines) + "\n", TARGETS[n % len(TARGETS)]) for n, lines in enumerate(files)]
    expected = [python_side(tmp_path, text, target) for text, target in cases]
    assert node_side(tmp_path, cases) == expected
    for text, target in cases:  # and Python as pip: the same requirements, names and markers
        path = tmp_path / "pip.txt"
        path.write_text(text)
        try:
            mine = ours(path, target.environment())
        except UsageError:
            continue
        theirs = pip_reads(path, target.environment())
        for entry in theirs + mine:
            if entry["url"]:
                entry["name"] = entry["specifier"] = None
        assert mine == theirs, text


FORKED = REPO_ROOT / "examples" / "audit" / "forked"


@pytest.mark.parametrize("name", ["uv.lock", "pylock.toml", "requirements.txt"])
def test_a_forked_project_reads_per_platform_in_every_form_and_on_the_page(name: str, tmp_path: Path) -> None:
    """examples/audit/forked/: one project that pins torch 2.4.1 on Linux, 2.6.0 on Windows and 2.5.1 on macOS, as
    `uv lock`, `uv export --format pylock.toml` and `uv export --format requirements-txt` wrote it: each form gives
    each machine its own torch, a complete environment, and the page reads it the same."""
    text = (FORKED / name).read_text()
    expected = {"linux": "2.4.1", "windows": "2.6.0", "macos": "2.5.1"}
    cases = [(text, target) for target in TARGETS]
    python = [python_side(tmp_path, text, target) for text, target in cases]
    for (_, target), found in zip(cases, python, strict=True):
        assert found["pins"]["torch"] == expected[target.system] and found["complete"], (name, target, found)
        assert found["pins"]["transformers"] == "4.46.3" and found["pins"]["peft"] == "0.13.2", found
    assert node_side(tmp_path, cases) == python
