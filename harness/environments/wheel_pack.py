"""Many days' wheels in one solid xz pack, so one device call (64 MiB) carries a whole atlas's pure-Python wheels.

A wheel is a zip: each file deflated on its own, so ten releases of transformers cost ten times one. Unpacked and
laid out file by file (the same path of every release side by side) in one xz stream, the releases compress
against each other: measured here, three transformers releases (30 MB of wheels) came to 3.2 MB. The pack holds
each wheel's members and their order (`manifest.json`); `unpack` writes the wheels back with the same members in
the same order, byte for byte the same files (their RECORD hashes hold), deflated again.
"""

from __future__ import annotations

import io
import json
import lzma
import tarfile
import zipfile
from pathlib import Path

MANIFEST = "manifest.json"
#: LZMA2 with a dictionary large enough to reach the same file of the previous release (file-major order puts
#: them side by side); preset 6 keeps packing a whole atlas's days a few minutes on a 2-core machine.
FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 6, "dict_size": 64 * 2**20}]
#: The same dictionary with the fastest preset: for a bisect round's pack (measured on one round's 188 MiB of
#: wheels: 24 s and 22.4 MiB against 129 s and 17.6 MiB at preset 6), where planning time matters more than size.
FAST_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 1, "dict_size": 64 * 2**20}]


def pack(wheels: list[Path], dest: Path, fast: bool = False) -> Path:
    """Write `dest` (.tar.xz) holding every member of `wheels`, file-major, and the manifest to rebuild them;
    `fast` packs about five times quicker and about a quarter bigger."""
    members: dict[str, list[list]] = {}
    entries: list[tuple[str, str, str, bytes]] = []
    for wheel in sorted(wheels, key=lambda p: p.name):
        with zipfile.ZipFile(wheel) as archive:
            infos = [info for info in archive.infolist() if not info.is_dir()]
            members[wheel.name] = [[i.filename, list(i.date_time), i.external_attr] for i in infos]
            entries += [(_path_key(i.filename), wheel.name, i.filename, archive.read(i)) for i in infos]
    entries.sort(key=lambda entry: (entry[0], entry[1]))
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    with lzma.open(partial, "wb", format=lzma.FORMAT_XZ, filters=FAST_FILTERS if fast else FILTERS) as stream:
        with tarfile.open(fileobj=stream, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            _add(tar, MANIFEST, json.dumps(members, indent=1, sort_keys=True).encode())
            for _, wheel_name, member, data in entries:
                _add(tar, f"{wheel_name}/{member}", data)
    partial.replace(dest)
    return dest


def _path_key(member: str) -> str:
    """The member's path with its dist-info folder's version taken out, so every release's copy sorts together."""
    head, _, rest = member.partition("/")
    if head.endswith((".dist-info", ".data")):
        head = head.split("-", 1)[0] + "." + head.rsplit(".", 1)[-1]
    return f"{head}/{rest}"


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def unpack(pack_file: Path, dest: Path) -> list[Path]:
    """Write the pack's wheels into `dest`; returns their paths."""
    files: dict[str, dict[str, bytes]] = {}
    members: dict[str, list[list]] = {}
    with lzma.open(pack_file, "rb") as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
        for info in tar:
            handle = tar.extractfile(info)
            if handle is None:
                continue
            data = handle.read()
            if info.name == MANIFEST:
                members = json.loads(data)
                continue
            wheel_name, _, member = info.name.partition("/")
            files.setdefault(wheel_name, {})[member] = data
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for wheel_name, names in members.items():
        path = dest / wheel_name
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for name, date_time, external_attr in names:
                info = zipfile.ZipInfo(name, date_time=tuple(date_time))
                info.external_attr = external_attr
                archive.writestr(info, files[wheel_name][name], compress_type=zipfile.ZIP_DEFLATED)
        written.append(path)
    return written
