"""`audit --fix` moves a requirements file to the way out's pins with every other byte kept (issue 73): extras, markers,
`--hash` continuations, comments, local version labels, the file's encoding and its line ends; what cannot be moved
in place is said. Each written file is read back with the reader `audit` uses."""

from __future__ import annotations

from pathlib import Path

from harness.tools.user_files.pins import read_pins
from harness.tools.user_files.requirements_edit import move
from harness.tools.user_files.target import target_of

LINUX = target_of("linux", "3.11")
COMPILED = (
    "torch[opt-einsum]==2.4.1 \\\n"
    "    --hash=sha256:aaaa \\\n"
    "    --hash=sha256:bbbb\n"
    "    # via -r requirements.in\n"
    'transformers==4.46.3 ; python_version >= "3.8"  # pinned\n'
    "peft>=0.13,<0.14\n"
)


def test_a_pip_compile_file_keeps_its_extras_hashes_markers_and_comments(tmp_path: Path) -> None:
    path = tmp_path / "requirements.txt"
    path.write_text(COMPILED)
    moved = move(path, {"torch": "2.6.0", "transformers": "5.15.0", "peft": "0.21.0"}, LINUX.environment())
    assert moved.after == (
        "torch[opt-einsum]==2.6.0 \\\n"
        "    --hash=sha256:aaaa \\\n"
        "    --hash=sha256:bbbb\n"
        "    # via -r requirements.in\n"
        'transformers==5.15.0 ; python_version >= "3.8"  # pinned\n'
        "peft==0.21.0\n"
    )
    assert any("--hash values are of the release it had" in n for n in moved.notes)
    assert sum(line.startswith(("-", "+")) and not line.startswith(("---", "+++")) for line in moved.diff()) == 6


def test_a_utf16_crlf_freeze_keeps_its_encoding_line_ends_and_local_labels(tmp_path: Path) -> None:
    path = tmp_path / "freeze.txt"
    text = "torch==2.5.1+cu121\r\ntransformers==4.46.3\r\nnumpy==1.26.4\r\n"
    path.write_bytes(b"\xff\xfe" + text.encode("utf-16-le"))
    moved = move(path, {"torch": "2.6.0", "accelerate": "1.5.2"}, LINUX.environment())
    moved.write()
    data = path.read_bytes()
    assert data.startswith(b"\xff\xfe")
    assert (
        data[2:].decode("utf-16-le")
        == "torch==2.6.0+cu121\r\ntransformers==4.46.3\r\nnumpy==1.26.4\r\naccelerate==1.5.2\r\n"
    )
    assert read_pins(path, LINUX).pins["torch"] == "2.6.0+cu121"  # read back by audit's own reader
    assert any(line.endswith("(CRLF)") for line in moved.diff())


def test_only_the_line_whose_marker_holds_on_the_target_moves(tmp_path: Path) -> None:
    path = tmp_path / "requirements.txt"
    path.write_text('torch==2.4.1; sys_platform == "linux"\ntorch==2.6.0; sys_platform == "win32"\n')
    moved = move(path, {"torch": "2.7.1"}, LINUX.environment())
    assert moved.after == 'torch==2.7.1; sys_platform == "linux"\ntorch==2.6.0; sys_platform == "win32"\n'
    windows = move(path, {"torch": "2.7.1"}, target_of("windows", "3.11").environment())
    assert windows.after == 'torch==2.4.1; sys_platform == "linux"\ntorch==2.7.1; sys_platform == "win32"\n'


def test_a_url_requirement_is_said_not_moved(tmp_path: Path) -> None:
    path = tmp_path / "requirements.txt"
    text = "deepspeed @ https://example.org/deepspeed-0.15.4.tar.gz\n"
    path.write_text(text)
    moved = move(path, {"deepspeed": "0.19.3"}, LINUX.environment())
    assert moved.after == text and any("given by URL" in n for n in moved.notes)
