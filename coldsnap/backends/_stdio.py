"""Which files a dumped tree's root had as stdout and stderr, read from the image.

A restore re-points them (CRIU's --inherit-fd) so that the restored tree writes where the
restore says and not into the directory it was dumped from, which may be gone. The chain in
the image: ids-<root>.img names the root's file table (files_id), fdinfo-<files_id>.img
maps fd 1 and 2 to file ids, files.img gives each file's path and mode (images/core.proto,
fdinfo.proto, regfile.proto; cr-dump.c writes ids-<pid>.img; field numbers never change).
"""

from __future__ import annotations

import stat
from pathlib import Path

from ._images import ImageFormatError, _entries, _fields, read_pstree

_STDOUT_STDERR = (1, 2)


def read_stdio_paths(images_dir: Path) -> tuple[str, ...]:
    """The paths of the regular files the root had open as fd 1 and 2 (each path once, stdout's
    first). Devices (/dev/null, a tty), pipes and sockets are left out: they are not in the
    directory the tree was dumped from, and re-pointing /dev/null would re-point stdin too."""
    try:
        root = read_pstree(images_dir)[0].pid
        files_id = _files_id(images_dir / f"ids-{root}.img")
        ids: dict[int, int] = {}
        for entry in _entries(images_dir / f"fdinfo-{files_id}.img"):
            values = {n: v for n, w, v in _fields(entry) if w == 0}
            if values.get(4) in _STDOUT_STDERR:  # fdinfo_entry.fd
                ids[int(values[4])] = int(values.get(1, -1))  # fdinfo_entry.id
        regular = _regular_files(images_dir)
    except OSError as exc:
        raise ImageFormatError(f"{images_dir}: cannot read the root's descriptors: {exc}") from None
    paths: list[str] = []
    for fd in _STDOUT_STDERR:
        path = regular.get(ids.get(fd, -1))
        if path is not None and path not in paths:
            paths.append(path)
    return tuple(paths)


def _files_id(ids_img: Path) -> int:
    for entry in _entries(ids_img):
        for number, wire, value in _fields(entry):
            if number == 2 and wire == 0:  # task_kobj_ids_entry.files_id
                return int(value)  # type: ignore[arg-type]
    raise ImageFormatError(f"{ids_img}: no files_id")


def _regular_files(images_dir: Path) -> dict[int, str]:
    """file id -> path of every regular file (by its recorded mode) in files.img."""
    found: dict[int, str] = {}
    files_img = images_dir / "files.img"
    if not files_img.exists():
        return found
    for entry in _entries(files_img):
        for number, wire, value in _fields(entry):
            if number != 3 or wire != 2:  # file_entry.reg
                continue
            reg = {n: v for n, _w, v in _fields(bytes(value))}  # type: ignore[arg-type]
            mode = reg.get(10)  # reg_file_entry.mode
            if 1 in reg and 6 in reg and isinstance(mode, int) and stat.S_ISREG(mode):
                name = bytes(reg[6]).decode("utf-8", "surrogateescape")  # type: ignore[arg-type]
                found[int(reg[1])] = name  # type: ignore[arg-type]
    return found
