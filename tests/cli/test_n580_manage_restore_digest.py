"""`coldsnap restore NAME` takes what `show` and `rm` take, through the same resolver: a tag, a
digest, or the short digest `ls` prints. A short digest is asked for as the full digest it names
(served by default under its first 12 hex digits); one that begins several digests, or none, is a
bad request (exit 2) naming the candidates or the tags, before anything is made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from coldsnap.artifacts import DIGEST_PREFIX, Capsule, Member, Store, to_json
from coldsnap.capsules import RECORD_NAME, CaptureRecord
from coldsnap.cli import main
from coldsnap.cli._serving import default_name


def _cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _publish(store: Store, tag: str, image: bytes) -> str:
    record = to_json(CaptureRecord(driver="n610", provider="native", engine="sglang",
                                   model_id="tiny", revision="local", facts={}))  # fmt: skip
    members = (
        Member("process-image", "image/pages-1.img", store.put_bytes(image), len(image)),
        Member("record", RECORD_NAME, store.put_bytes(record), len(record)),
    )
    return store.publish(Capsule(members=members, identity=None), tag=tag)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    opened = Store(tmp_path / "store")
    _publish(opened, "tiny", b"pages")
    return opened


def _request(store: Store, name: str) -> dict[str, object]:
    result = _cli("restore", name, "--store", str(store.root), "--print-request")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_restore_takes_the_short_digest_ls_prints(store: Store) -> None:
    digest = store.resolve("tiny")
    short = digest.removeprefix(DIGEST_PREFIX)[:12]
    assert short in _cli("ls", "--store", str(store.root)).stdout
    for name in (short, DIGEST_PREFIX + short, short[:6]):
        request = _request(store, name)
        assert request["artifact"] == digest, name
        assert default_name(str(request["artifact"])) == short
        assert f"restore-{short}-" in str(request["workdir"])


def test_a_tag_is_restored_as_the_tag(store: Store) -> None:
    assert _request(store, "tiny")["artifact"] == "tiny"


def test_an_ambiguous_short_digest_names_the_candidates(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    digest = store.resolve("tiny")
    twin = DIGEST_PREFIX + digest.removeprefix(DIGEST_PREFIX)[:6] + "0" * 58
    if twin == digest:
        twin = twin[:-1] + "1"
    monkeypatch.setattr(Store, "capsules", lambda self: sorted([digest, twin]))
    result = _cli("restore", digest.removeprefix(DIGEST_PREFIX)[:6], "--store", str(store.root))
    assert result.exit_code == 2, result.output
    assert "field 'NAME'" in result.stderr and "is ambiguous" in result.stderr
    assert digest in result.stderr and twin in result.stderr
    assert not (store.root.parent / "ops").exists(), "a refused restore made its workdir"


def test_a_short_digest_that_names_no_capsule_lists_the_tags(store: Store) -> None:
    digest = store.resolve("tiny")
    unknown = "0123456789ab" if not digest.startswith(DIGEST_PREFIX + "0123") else "fedcba987654"
    result = _cli("restore", unknown, "--store", str(store.root))
    assert result.exit_code == 2, result.output
    assert f"no capsule whose digest begins with {unknown}" in result.stderr
    assert "(tags: tiny)" in result.stderr
