"""A full disk under a running operation: the step that fills it fails, the journal's appends
fail too, and the run still compensates everything it did; the journal on disk never holds a
torn line, is whole again once the disk has room, and what cannot be recorded is raised (with
the receipt) so that a `resume` finishes the record."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from coldsnap.machine import (
    JOURNAL_NAME,
    JournalUnwritable,
    Machine,
    StepContext,
    read_journal,
)
from coldsnap.testing import MemoryWorld

from ._support import capture_request, memory_machine

_real_write = os.write


class Disk:
    """The filesystem of the workdir's journal, as the journal's writes see it: while `full`,
    a write fails with ENOSPC; `short` makes the next write put only half its bytes on disk and
    return the short count (what write(2) does when the disk fills in the middle)."""

    def __init__(self, journal: Path) -> None:
        self.journal = journal
        self.full = False
        self.short = False
        self.refused = 0

    def write(self, fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}") != str(self.journal):
            return _real_write(fd, data)
        if self.full:
            self.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if self.short:
            self.short = False
            self.refused += 1
            return _real_write(fd, data[: len(data) // 2])
        return _real_write(fd, data)


@pytest.fixture
def disk(tmp_path, monkeypatch) -> Disk:
    disk = Disk(tmp_path / "cap" / JOURNAL_NAME)
    monkeypatch.setattr(os, "write", disk.write)
    return disk


def _filling_dump(machine: Machine, disk: Disk, *, frees: bool) -> None:
    """The driver's dump writes part of the image, fills the disk and fails with ENOSPC; with
    `frees`, discarding that partial image (the dump's compensation) gives the space back."""
    driver = machine.components["driver"]
    dump, discard = driver.dump, driver.discard_dump

    def filling(ctx: StepContext) -> Any:
        dump(ctx)  # the partial image exists
        disk.full = True
        raise OSError(errno.ENOSPC, "No space left on device", "pages-1.img")

    def freeing(ctx: StepContext) -> Any:
        discard(ctx)
        disk.full = not frees

    driver.dump, driver.discard_dump = filling, freeing


def test_a_full_disk_during_a_failing_step_still_compensates(tmp_path, disk) -> None:
    world = MemoryWorld()
    machine = memory_machine(world, capture_request(tmp_path))
    _filling_dump(machine, disk, frees=True)
    receipt = machine.capture(capture_request(tmp_path))
    assert disk.refused, "the journal's appends never met the full disk"
    assert receipt.outcome == "rolled_back"
    assert receipt.failure is not None and receipt.failure.step == "process_dump"
    assert "No space left" in receipt.failure.message
    assert not world.transient(), "the engine or the partial image was left"
    # The records held back while the disk was full were written once it had room, in order.
    records = read_journal(tmp_path / "cap" / JOURNAL_NAME)
    events = [(r.event, r.step) for r in records]
    assert ("step_fail", "process_dump") in events
    assert ("comp_end", "process_dump") in events
    assert events[-1] == ("end", None)
    assert (tmp_path / "cap" / "receipt.json").exists()


def test_a_disk_that_stays_full_compensates_and_says_to_resume(tmp_path, disk) -> None:
    world = MemoryWorld()
    machine = memory_machine(world, capture_request(tmp_path))
    _filling_dump(machine, disk, frees=False)
    with pytest.raises(JournalUnwritable, match="resume the operation in this workdir") as caught:
        machine.capture(capture_request(tmp_path))
    assert caught.value.receipt is not None
    assert caught.value.receipt.outcome == "rolled_back"
    assert not world.transient(), "the engine or the partial image was left"
    workdir = tmp_path / "cap"
    assert not (workdir / "receipt.json").exists()
    # What reached the disk is whole records only: the journal reads, up to the failing step.
    assert read_journal(workdir / JOURNAL_NAME)[-1].event == "step_start"
    disk.full = False
    again = memory_machine(world, capture_request(tmp_path)).resume(workdir)
    assert again.outcome == "rolled_back"
    assert not world.transient()
    assert read_journal(workdir / JOURNAL_NAME)[-1].event == "end"
    assert (workdir / "receipt.json").exists()


def test_a_short_write_leaves_no_torn_line_and_the_run_compensates(tmp_path, disk) -> None:
    """The disk fills in the middle of a step's end record: the half written is cut off, the
    record is written whole with the next one, and the run, its journal briefly behind, goes
    no further and rolls back."""
    world = MemoryWorld()
    machine = memory_machine(world, capture_request(tmp_path))
    driver = machine.components["driver"]
    launch = driver.launch_engine

    def launch_then_fill(ctx: StepContext) -> Any:
        facts = launch(ctx)
        disk.short = True  # the step's end record meets the disk filling up
        return facts

    driver.launch_engine = launch_then_fill
    receipt = machine.capture(capture_request(tmp_path))
    assert disk.refused == 1
    assert receipt.outcome == "rolled_back"
    assert receipt.failure is not None and receipt.failure.type == "JournalUnwritable"
    assert not world.transient()
    records = read_journal(tmp_path / "cap" / JOURNAL_NAME)
    events = [(r.event, r.step) for r in records if r.event != "progress"]
    at = events.index(("step_start", "launch_engine"))
    assert events[at : at + 3] == [("step_start", "launch_engine"),
                                   ("step_end", "launch_engine"), ("step_fail", None)]  # fmt: skip
    assert ("comp_end", "launch_engine") in events
