"""The store commands open a store as it is: pointed at a directory that is not a store they
refuse and change nothing in it (no mode narrowed, no folder made, nobody's file removed), and
`ls` lists every readable capsule when another one is damaged, naming the damaged one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from coldsnap.artifacts import Store

from .test_store_cli import cli, publish


def _shared(root: Path) -> dict[str, int]:
    """A world-writable sticky directory holding another user's files (as /tmp would), and
    the modes of everything in it."""
    root.mkdir()
    os.chmod(root, 0o1777)
    (root / "tmp").mkdir()
    (root / "tmp" / "someone-elses-file").write_bytes(b"theirs")
    os.utime(root / "tmp" / "someone-elses-file", (0, 0))  # old enough for any grace
    return _modes(root)


def _modes(root: Path) -> dict[str, int]:
    return {str(p): os.lstat(p).st_mode for p in [root, *root.rglob("*")]}


@pytest.mark.parametrize(
    "command",
    [("ls",), ("ls", "--json"), ("show", "tiny"), ("rm", "tiny"), ("gc", "--grace", "0")],
)
def test_a_store_command_on_a_directory_that_is_not_a_store_changes_nothing(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    root = tmp_path / "shared"
    before = _shared(root)
    result = cli(*command, "--store", str(root))
    assert result.exit_code != 0 and "is not a coldsnap store" in result.stderr, result.output
    assert _modes(root) == before
    assert (root / "tmp" / "someone-elses-file").read_bytes() == b"theirs"


def test_ls_lists_the_readable_capsules_beside_a_damaged_one(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    good = publish(store, "good")
    bad = publish(store, "bad", image=b"other pages")
    manifest = store.path(bad)
    os.chmod(manifest, 0o600)
    manifest.write_bytes(b"{}")  # the manifest no longer hashes to its name
    result = cli("ls", "--store", str(store.root))
    assert result.exit_code == 1, result.output
    rows = {line.split()[1]: line.split() for line in result.stdout.splitlines()[1:]}
    assert rows[good.removeprefix("sha256:")[:12]][0] == "good"
    assert rows[bad.removeprefix("sha256:")[:12]][2] == "DAMAGED"
    assert f"capsule {bad} is damaged" in result.stderr

    listed = cli("ls", "--json", "--store", str(store.root))
    assert listed.exit_code == 1
    by_digest = {row["digest"]: row for row in json.loads(listed.stdout)}
    assert by_digest[good]["tags"] == ["good"] and "damaged" not in by_digest[good]
    assert "does not hash to its name" in by_digest[bad]["damaged"]
