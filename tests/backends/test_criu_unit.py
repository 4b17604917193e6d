"""The CRIU backend's parts that need no CRIU: versions, log reading, records, image reading."""

from __future__ import annotations

import os
import pickle
import re
import struct
from pathlib import Path

import pytest

from coldsnap._errors import ColdsnapError, OperationError
from coldsnap.backends import (
    BackendError,
    Criu,
    CriuError,
    CriuUnavailable,
    CriuVersion,
    DumpManifest,
    GpuMappingFound,
    LaunchError,
    PidCollision,
    SavedFile,
)
from coldsnap.backends._files import put_back, saved_name
from coldsnap.backends._images import ImageFormatError, read_file_paths, read_pstree
from coldsnap.backends._log import first_error
from coldsnap.backends._records import read_record, write_record


def _fake_criu(tmp_path: Path, version: str) -> Path:
    path = tmp_path / "criu"
    path.write_text(f"#!/bin/sh\necho 'Version: {version}'\n")
    path.chmod(0o755)
    return path


def test_version_parse_and_order() -> None:
    assert CriuVersion.parse("Version: 4.2.1\nGitID: v4.2.1") == CriuVersion(4, 2, 1)
    assert CriuVersion.parse("Version: 3.17") == CriuVersion(3, 17, 0)
    assert CriuVersion(3, 17, 1) < CriuVersion(4, 2, 0) < CriuVersion(4, 10, 0)
    with pytest.raises(ValueError):
        CriuVersion.parse("criu, but no version")


def test_an_old_criu_is_refused_before_any_side_effect(tmp_path: Path) -> None:
    old = Criu(_fake_criu(tmp_path, "3.17.1"))
    with pytest.raises(CriuUnavailable, match=r"3\.17\.1, below 4\.2"):
        old.require_version()
    with pytest.raises(CriuUnavailable):
        old.dump(1, tmp_path / "image")
    assert not (tmp_path / "image").exists()


def test_an_explicit_binary_is_never_swapped(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("COLDSNAP_CRIU", str(tmp_path / "missing-criu"))
    criu = Criu()
    assert criu.binary == tmp_path / "missing-criu"
    with pytest.raises(CriuUnavailable, match="cannot run"):
        criu.version()


def test_first_error_skips_the_harmless_rlimit_line() -> None:
    log = (
        "(00.000010) Version: 4.2.1\n"
        "(00.059149) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self\n"
        "(00.100000) Warn  (criu/x.c:1): not an error\n"
        "(00.200000) Error (criu/files-reg.c:2127): Can't open file tmp/x on restore: No such\n"
        "(00.300000) Error (criu/cr-restore.c:1): a later error\n"
    )
    assert (
        first_error(log)
        == "Error (criu/files-reg.c:2127): Can't open file tmp/x on restore: No such"
    )
    assert (
        first_error("Error (criu/util.c:642): execvp failed")
        == "Error (criu/util.c:642): execvp failed"
    )
    assert first_error("all fine\n") is None


def test_manifest_round_trip_and_kind_check(tmp_path: Path) -> None:
    manifest = DumpManifest(
        root_pid=42,
        pids=(42, 43),
        own_pid_namespace=False,
        leave_running=True,
        criu_version="4.2.1",
        criu_args=("dump", "-t", "42"),
        kernel="6.18",
        seconds=0.25,
        image_bytes=1000,
        saved_files=(SavedFile(path="/dev/shm/x", saved_as="coldsnap-files/dev/shm/x", size=3),),
    )
    path = write_record(tmp_path / "m.json", manifest)
    assert read_record(path, DumpManifest) == manifest
    path.write_text(path.read_text().replace('"coldsnap.criu-dump"', '"something-else"'))
    with pytest.raises(ValueError, match="kind"):
        read_record(path, DumpManifest)


def _image(entries: list[bytes]) -> bytes:
    out = struct.pack("<II", 0x54564319, 0x50273030)
    for entry in entries:
        out += struct.pack("<I", len(entry)) + entry
    return out


def _varint(value: int) -> bytes:
    out = b""
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def test_image_reader(tmp_path: Path) -> None:
    root = _field(1, 1000) + _field(2, 0) + _field(5, 1000) + _field(5, 1001)
    child = _field(1, 1002) + _field(2, 1000) + _field(5, _varint(1002) + _varint(1003))  # packed
    (tmp_path / "pstree.img").write_bytes(_image([root, child]))
    tasks = read_pstree(tmp_path)
    assert [(t.pid, t.ppid, t.threads) for t in tasks] == [
        (1000, 0, (1000, 1001)),
        (1002, 1000, (1002, 1003)),
    ]

    def reg(name: str) -> bytes:
        return (
            _field(1, 1)
            + _field(2, 7)
            + _field(3, _field(1, 7) + _field(2, 0) + _field(6, name.encode()))
        )

    (tmp_path / "files.img").write_bytes(
        _image([reg("/dev/shm/a"), reg("/usr/lib/b.so"), reg("/dev/shm/a")])
    )
    assert read_file_paths(tmp_path) == ("/dev/shm/a", "/usr/lib/b.so")


def test_a_truncated_image_is_an_image_format_error(tmp_path: Path) -> None:
    (tmp_path / "pstree.img").write_bytes(_image([_field(1, 1000)])[:-1])
    with pytest.raises(ImageFormatError, match="truncated entry") as info:
        read_pstree(tmp_path)
    assert isinstance(info.value, BackendError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "error",
    [
        CriuError("restore", "exited with 1", Path("/w/restore.log"), "Error (x.c:1): no", 1),
        CriuUnavailable("version", "no criu binary found"),
        PidCollision(42, "process 'python'"),
        GpuMappingFound(7, "/dev/nvidia0"),
        LaunchError("launch: argv is empty"),
    ],
)
def test_backend_errors_are_operation_errors_that_keep_their_fields(error) -> None:
    assert isinstance(error, BackendError) and isinstance(error, OperationError)
    assert isinstance(error, ColdsnapError)
    copy = pickle.loads(pickle.dumps(error))  # they cross process boundaries whole
    assert type(copy) is type(error) and str(copy) == str(error)


def test_criu_error_message_names_the_first_error_and_the_log() -> None:
    error = CriuError("restore", "exited with 1", Path("/w/restore.log"), "Error (x.c:1): no", 1)
    assert str(error) == (
        "criu restore: exited with 1; first error: Error (x.c:1): no; whole log: /w/restore.log"
    )
    assert str(CriuError("dump", "timed out after 5 s")) == "criu dump: timed out after 5 s"


def test_put_back_replaces_the_file_whole_with_its_mode_and_times(tmp_path: Path) -> None:
    path = tmp_path / "shm" / "sglang_loads_1.shm"
    saved = tmp_path / "image" / saved_name(str(path))
    saved.parent.mkdir(parents=True)
    saved.write_bytes(b"at dump" * 100)
    os.chmod(saved, 0o640)
    os.utime(saved, ns=(1_000_000_000, 2_000_000_000))
    path.parent.mkdir()
    path.write_bytes(b"changed later")
    with open(path, "rb") as held:  # a process that still has the old file keeps it
        put_back(tmp_path / "image", str(path))
        assert held.read() == b"changed later"
    assert path.read_bytes() == b"at dump" * 100
    st = path.stat()
    assert (oct(st.st_mode & 0o777), st.st_mtime_ns) == ("0o640", 2_000_000_000)
    assert sorted(os.listdir(path.parent)) == [path.name]  # no temporary file left


def test_stdio_paths_follow_the_root_s_file_table_to_regular_files_only(tmp_path: Path) -> None:
    """ids-<root>.img (files_id) -> fdinfo-<id>.img (fd -> file id) -> files.img."""
    from coldsnap.backends._stdio import read_stdio_paths

    (tmp_path / "pstree.img").write_bytes(_image([_field(1, 1000) + _field(2, 0)]))
    ids = _field(1, 3) + _field(2, 9) + _field(3, 4) + _field(4, 5)
    (tmp_path / "ids-1000.img").write_bytes(_image([ids]))

    def fd(number: int, file_id: int) -> bytes:
        return _field(1, file_id) + _field(2, 0) + _field(3, 1) + _field(4, number)

    (tmp_path / "fdinfo-9.img").write_bytes(_image([fd(0, 20), fd(1, 21), fd(2, 21), fd(7, 22)]))

    def reg(file_id: int, name: str, mode: int) -> bytes:
        entry = _field(1, file_id) + _field(2, 0) + _field(6, name.encode()) + _field(10, mode)
        return _field(1, 1) + _field(2, file_id) + _field(3, entry)

    files = [reg(20, "/dev/null", 0o20666), reg(21, "/w/cap/engine.log", 0o100644)]
    files.append(reg(22, "/w/cap/other.txt", 0o100644))
    (tmp_path / "files.img").write_bytes(_image(files))
    assert read_stdio_paths(tmp_path) == ("/w/cap/engine.log",)

    # stdout to /dev/null (a character device): nothing to re-point, stdin stays /dev/null
    (tmp_path / "fdinfo-9.img").write_bytes(_image([fd(0, 20), fd(1, 20), fd(2, 20)]))
    assert read_stdio_paths(tmp_path) == ()

    (tmp_path / "fdinfo-9.img").unlink()
    with pytest.raises(ImageFormatError, match="cannot read the root's descriptors"):
        read_stdio_paths(tmp_path)


def test_inherit_fd_arguments_name_a_file_as_criu_does() -> None:
    from coldsnap.backends.criu import _inherit_args

    assert _inherit_args(7, ["/w/cap/engine.log", "/tmp/x y"]) == [
        "--inherit-fd",
        "fd[7]:w/cap/engine.log",
        "--inherit-fd",
        "fd[7]:tmp/x y",
    ]


def test_first_error_reads_a_restored_task_s_own_lines() -> None:
    """A task's lines carry its PID; the summary line after them says only 'FAILED'."""
    log = (
        "(00.032467) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self\n"
        "(00.033714)  24974: Error (criu/files-reg.c:2353): Can't open file w/engine.log on "
        "restore: No such file or directory\n"
        "(00.033738) Error (criu/cr-restore.c:2331): Restoring FAILED.\n"
    )
    assert first_error(log) == (
        "Error (criu/files-reg.c:2353): Can't open file w/engine.log on restore: "
        "No such file or directory"
    )


def _stdio_image(tmp_path: Path, root: int, stdout: str, mode: int) -> Path:
    """A minimal image whose root has `stdout` (a file of `mode`) as fd 1 and 2."""
    images = tmp_path / "image"
    images.mkdir()
    (images / "inventory.img").write_bytes(_image([]))
    (images / "pstree.img").write_bytes(_image([_field(1, root) + _field(2, 0)]))
    ids = _field(1, 3) + _field(2, 9) + _field(3, 4) + _field(4, 5)
    (images / f"ids-{root}.img").write_bytes(_image([ids]))
    fds = [_field(1, 21) + _field(2, 0) + _field(3, 1) + _field(4, n) for n in (1, 2)]
    (images / "fdinfo-9.img").write_bytes(_image(fds))
    entry = _field(1, 21) + _field(2, 0) + _field(6, stdout.encode()) + _field(10, mode)
    (images / "files.img").write_bytes(_image([_field(1, 1) + _field(2, 21) + _field(3, entry)]))
    return images


def _recording_criu(tmp_path: Path, pid: int) -> tuple[Path, Path]:
    """A stand-in `criu` that records its arguments and what each --inherit-fd descriptor it
    was handed points to, then reports `pid` as restored."""
    record = tmp_path / "criu-calls"
    path = tmp_path / "criu"
    path.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then echo "Version: 4.2.1"; exit 0; fi\n'
        f'echo "$@" >> {record}.args\n'
        'for a in "$@"; do case "$a" in fd\\[*) n=${a#fd[}; n=${n%%]*};'
        f" readlink /proc/self/fd/$n >> {record}.fds;; esac; done\n"
        'while [ $# -gt 0 ]; do [ "$1" = --pidfile ] && echo ' + str(pid) + ' > "$2"; shift; done\n'
    )
    path.chmod(0o755)
    return path, record


def _free_pid() -> int:
    return next(p for p in range(32000, 1000, -1) if not os.path.exists(f"/proc/{p}"))


def test_restore_hands_criu_the_output_file_for_the_image_s_stdio(tmp_path: Path) -> None:
    pid = _free_pid()
    binary, record = _recording_criu(tmp_path, pid)
    images = _stdio_image(tmp_path, pid, "/gone/capture/engine.log", 0o100644)
    out = tmp_path / "restore" / "engine.log"
    tree = Criu(binary).restore(images, work_dir=tmp_path / "op", output=out)
    assert tree.pid == pid
    args = (record.with_suffix(".args")).read_text().split()
    fd = re.fullmatch(r"fd\[(\d+)\]:gone/capture/engine\.log", args[args.index("--inherit-fd") + 1])
    assert fd, args
    assert record.with_suffix(".fds").read_text().split() == [str(out)]
    assert out.exists()
    ours = [p for p in Path("/proc/self/fd").iterdir() if os.path.realpath(p) == str(out)]
    assert not ours, "the output file stayed open here after CRIU ran"

    (tmp_path / "op2").mkdir()
    Criu(binary).restore(images, work_dir=tmp_path / "op2")  # without output: as dumped
    assert "--inherit-fd" not in record.with_suffix(".args").read_text().splitlines()[-1]


def test_restore_never_re_points_a_device_such_as_dev_null(tmp_path: Path) -> None:
    pid = _free_pid()
    binary, record = _recording_criu(tmp_path, pid)
    images = _stdio_image(tmp_path, pid, "/dev/null", 0o20666)
    out = tmp_path / "restore" / "engine.log"
    Criu(binary).restore(images, work_dir=tmp_path / "op", output=out)
    assert "--inherit-fd" not in record.with_suffix(".args").read_text()
    assert not out.exists()
