"""The store commands as an operator meets them: one default store everywhere, the short digests
`ls` prints taken back by `show` and `rm`, `gc` freeing a re-captured tag's earlier capsule
(never one a restore serves) and saying what it kept and why, `rm` saying what it freed, and a
store this user may not read told apart from one that does not exist."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from coldsnap._paths import DEFAULT_STORE
from coldsnap.artifacts import DIGEST_PREFIX, Store
from coldsnap.cli import _serving, main
from coldsnap.cli._store_cmds import _size, gc, ls, rm, show

from .test_store_cli import cli, publish

ROOT = Path(__file__).resolve().parents[2]
HOUR_AGO = time.time() - 3600 * 2


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv(_serving.SERVING_ENV, str(tmp_path / "serving"))
    return Store(tmp_path / "store")


def _age(store: Store, capsule: str) -> None:
    """Makes a capsule and its objects look published two hours ago."""
    os.utime(store.root / "capsules" / capsule.removeprefix(DIGEST_PREFIX), (HOUR_AGO,) * 2)
    for member in [capsule, *(m.digest for m in store.capsule(capsule).members)]:
        os.utime(store.path(member), (HOUR_AGO,) * 2)


def _store_option(command: click.Command) -> click.Option:
    return next(p for p in command.params if isinstance(p, click.Option) and p.name == "store")


# -- one store path ---------------------------------------------------------------------------


@pytest.mark.parametrize("command", [ls, show, rm, gc], ids=lambda c: c.name)
def test_store_commands_default_to_the_store_capture_and_restore_use(
    command: click.Command,
) -> None:
    capture = main.get_command(click.Context(main), "capture")
    restore = main.get_command(click.Context(main), "restore")
    assert capture is not None and restore is not None
    assert _store_option(capture).default == _store_option(restore).default == DEFAULT_STORE
    option = _store_option(command)
    assert not option.required and option.default == DEFAULT_STORE


@pytest.mark.parametrize("doc", ["README.md", "docs/cli.md"])
def test_the_docs_name_one_store_path(doc: str) -> None:
    text = (ROOT / doc).read_text()
    named = set(re.findall(r"--store[ =](/\S+)", text)) | set(re.findall(r'store="([^"]+)"', text))
    named |= set(re.findall(r"^store: (\S+)", text, flags=re.MULTILINE))
    assert named <= {str(DEFAULT_STORE)}, named


def test_ls_without_store_lists_the_default_store(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    digest = publish(store, "tiny")
    monkeypatch.setattr(_store_option(ls), "default", store.root)
    result = cli("ls")
    assert result.exit_code == 0, result.output
    assert digest.removeprefix(DIGEST_PREFIX)[:12] in result.stdout


# -- short digests ----------------------------------------------------------------------------


def test_show_and_rm_take_the_short_digest_ls_prints(store: Store) -> None:
    digest = publish(store, "tiny")
    other = publish(store, "other", image=b"other pages")
    short = digest.removeprefix(DIGEST_PREFIX)[:12]
    listed = cli("ls", "--store", str(store.root)).stdout
    assert short in listed
    shown = cli("show", short, "--store", str(store.root))
    assert shown.exit_code == 0, shown.output
    assert f"digest:    {digest}" in shown.stdout
    assert cli("show", "sha256:" + short, "--store", str(store.root)).stdout == shown.stdout
    removed = cli("rm", short, "--store", str(store.root))
    assert removed.exit_code == 0, removed.output
    assert f"removed capsule {digest} (tags tiny)" in removed.stdout
    assert store.capsules() == [other]


def test_an_ambiguous_short_digest_names_the_candidates(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    digest = publish(store, "tiny")
    twin = DIGEST_PREFIX + digest.removeprefix(DIGEST_PREFIX)[:6] + "0" * 58
    if twin == digest:
        twin = twin[:-1] + "1"
    monkeypatch.setattr(Store, "capsules", lambda self: sorted([digest, twin]))
    result = cli("show", digest.removeprefix(DIGEST_PREFIX)[:6], "--store", str(store.root))
    assert result.exit_code == 2
    assert "is ambiguous" in result.stderr
    assert digest in result.stderr and twin in result.stderr


def test_an_unknown_short_digest_says_none_matches(store: Store) -> None:
    digest = publish(store, "tiny")
    unknown = "0123456789ab" if not digest.startswith("sha256:0123") else "fedcba987654"
    result = cli("rm", unknown, "--store", str(store.root))
    assert result.exit_code == 2
    assert f"no tag {unknown!r} and no capsule whose digest begins with {unknown}" in result.stderr
    assert "(tags: tiny)" in result.stderr
    assert store.capsules() == [digest]


def test_a_tag_spelled_like_hex_is_still_the_tag(store: Store) -> None:
    tagged = publish(store, "cafe1234")
    publish(store, "tiny", image=b"other pages")
    assert store.lookup("cafe1234") == tagged


# -- gc of untagged capsules; what gc and rm say -----------------------------------------------


def test_gc_frees_a_re_captured_tag_s_earlier_capsule(store: Store) -> None:
    earlier = publish(store, "tiny", image=b"first capture")
    _age(store, earlier)
    current = publish(store, "tiny", image=b"second capture")
    result = cli("gc", "--store", str(store.root))
    assert result.exit_code == 0, result.output
    assert f"removed untagged capsule {earlier}" in result.stdout
    assert store.capsules() == [current]
    assert not store.has(earlier)
    assert store.capsule("tiny").members[0].digest != earlier
    assert store.verify().ok


def test_gc_keeps_an_untagged_capsule_a_restore_serves(store: Store) -> None:
    earlier = publish(store, "tiny", image=b"first capture")
    _age(store, earlier)
    publish(store, "tiny", image=b"second capture")
    _serving.record(
        _serving.Serving(
            name="tiny", workdir="/nowhere", artifact="tiny", capsule_digest=earlier,
            url=None, pid=None, started=time.time(),
        )
    )  # fmt: skip
    result = cli("gc", "--store", str(store.root))
    assert result.exit_code == 0, result.output
    assert f"kept untagged capsule {earlier}: a restore serves it" in result.stdout
    assert earlier in store.capsules() and store.has(earlier)


def test_gc_keeps_untagged_capsules_while_a_restore_has_not_named_its_own(store: Store) -> None:
    earlier = publish(store, "tiny", image=b"first capture")
    _age(store, earlier)
    publish(store, "tiny", image=b"second capture")
    _serving.record(
        _serving.Serving(
            name="starting", workdir="/nowhere", artifact="tiny", capsule_digest=None,
            url=None, pid=None, started=time.time(),
        )
    )  # fmt: skip
    result = cli("gc", "--store", str(store.root))
    assert result.exit_code == 0, result.output
    assert "kept every untagged capsule: the restore serving as starting" in result.stdout
    assert earlier in store.capsules()


def test_gc_with_its_default_grace_says_what_it_kept_and_why(store: Store) -> None:
    publish(store, "tiny", image=b"first capture")
    publish(store, "tiny", image=b"second capture")
    store.put_bytes(b"a capture's object, not yet published")
    result = cli("gc", "--store", str(store.root))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert any(
        line.startswith("kept untagged capsule ") and line.endswith("within the grace (3600 s)")
        for line in lines
    ), lines
    assert re.fullmatch(
        r"gc: removed 0 objects \(0 B\) and 0 untagged capsules; kept \d+ objects \(.+\) that "
        r"capsules use, 1 object \(37 B\) unused but within the grace \(3600 s\)",
        lines[-1],
    ), lines[-1]


def test_rm_of_a_tag_says_what_it_freed(store: Store) -> None:
    digest = publish(store, "tiny", image=b"only tiny's pages")
    publish(store, "other", image=b"other pages")  # the same payload and capture record
    mine = {m.digest: m.size for m in store.capsule(digest).members}
    mine[digest] = store.size(digest)
    shared = {m.digest for m in store.capsule("other").members} & set(mine)
    assert len(shared) == 2
    only = sum(size for d, size in mine.items() if d not in shared)
    result = cli("rm", "tiny", "--store", str(store.root))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"removed capsule {digest} (tags tiny)",
        f"freed 2 objects ({_size(only)}) only it used",
        f"kept 2 objects ({_size(sum(mine[d] for d in shared))}) other capsules also use",
    ]
    assert not store.has(digest) and all(store.has(d) for d in shared)
    assert store.verify().ok


def test_rm_leaves_an_object_written_again_since_publishing_to_gc(store: Store) -> None:
    digest = publish(store, "tiny", image=b"only tiny's pages")
    _age(store, digest)
    image = store.capsule(digest).members[0].digest
    assert store.put_bytes(b"only tiny's pages") == image  # a capture taking it again
    result = cli("rm", "tiny", "--store", str(store.root))
    assert result.exit_code == 0, result.output
    assert "written again since it was published" in result.stdout
    assert store.has(image) and not store.has(digest)


@pytest.mark.parametrize("recorded", [True, False], ids=["serving", "starting"])
def test_rm_refuses_a_capsule_a_restore_serves(store: Store, recorded: bool) -> None:
    digest = publish(store, "tiny")
    _serving.record(
        _serving.Serving(
            name="front", workdir="/nowhere", artifact="tiny",
            capsule_digest=digest if recorded else None, url=None, pid=None,
            started=time.time(),
        )
    )  # fmt: skip
    result = cli("rm", digest.removeprefix(DIGEST_PREFIX)[:12], "--store", str(store.root))
    assert result.exit_code == 2, result.output
    assert "is what front serves here" in result.stderr
    assert "coldsnap stop front" in result.stderr
    assert store.capsules() == [digest] and store.verify().ok


# -- a store this user may not read ------------------------------------------------------------


@contextlib.contextmanager
def _as_nobody() -> Iterator[None]:
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)


@pytest.mark.skipif(os.geteuid() != 0, reason="drops root for a moment to be another user")
def test_ls_of_a_store_only_root_reads_says_permission() -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        os.chmod(folder, 0o755)  # others may enter it; the store itself is 0700, root's
        store = Store(Path(folder) / "store")
        publish(store, "tiny")
        with _as_nobody():
            result = cli("ls", "--store", str(store.root))
    assert result.exit_code == 1, result.output
    assert f"cannot read the store at {store.root}: permission denied" in result.stderr
    assert f"({store.root} belongs to uid 0, mode 0700" in result.stderr
    assert "does not exist" not in result.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="drops root for a moment to be another user")
def test_ls_below_a_folder_only_root_may_enter_says_permission(store: Store) -> None:
    assert stat_mode(store.root.parent) & 0o077 == 0  # pytest's tmp folders are 0700
    with _as_nobody():
        result = cli("ls", "--store", str(store.root))
    assert result.exit_code == 1, result.output
    assert f"cannot read the store at {store.root}: permission denied" in result.stderr


def stat_mode(path: Path) -> int:
    return os.stat(path).st_mode & 0o777
