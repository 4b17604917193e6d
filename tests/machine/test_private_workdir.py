"""An operation's workdir holds the process image (the engine's memory): it is 0700 even where
the user made it beforehand with another mode, and one whose mode is not the operation's to
change (another user's, a shared sticky directory) is refused before anything is written."""

from __future__ import annotations

import os
import stat

import pytest

from coldsnap.machine import JOURNAL_NAME, RequestError
from coldsnap.testing import MemoryWorld

from ._support import capture_request, memory_machine


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_an_existing_open_workdir_is_made_private(tmp_path) -> None:
    workdir = tmp_path / "cap"
    workdir.mkdir()
    os.chmod(workdir, 0o755)
    request = capture_request(tmp_path)
    receipt = memory_machine(MemoryWorld(), request).capture(request)
    assert receipt.ok, receipt.error
    assert _mode(workdir) == 0o700
    assert _mode(workdir / JOURNAL_NAME) == 0o600
    assert _mode(workdir / "receipt.json") == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_another_users_workdir_is_refused_untouched(tmp_path) -> None:
    workdir = tmp_path / "cap"
    workdir.mkdir()
    os.chmod(workdir, 0o755)
    os.chown(workdir, 65534, 65534)
    request = capture_request(tmp_path)
    with pytest.raises(RequestError, match="belongs to uid 65534") as refused:
        memory_machine(MemoryWorld(), request).capture(request)
    assert refused.value.fields == ("workdir",)
    assert _mode(workdir) == 0o755
    assert os.listdir(workdir) == []


def test_a_shared_sticky_directory_is_refused_as_a_workdir(tmp_path) -> None:
    workdir = tmp_path / "cap"
    workdir.mkdir()
    os.chmod(workdir, 0o1777)
    request = capture_request(tmp_path)
    with pytest.raises(RequestError, match="shared directory"):
        memory_machine(MemoryWorld(), request).capture(request)
    assert _mode(workdir) == 0o1777
    assert os.listdir(workdir) == []
