"""`coldsnap ls`, `show` and `gc` over a store built with coldsnap.artifacts directly (no engine):
what each prints, `--json`, and that gc removes only what no capsule reaches."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from coldsnap.artifacts import (
    Capsule,
    EngineBuild,
    FileDigest,
    Identity,
    Member,
    ModelBinding,
    Platform,
    SnapshotDriver,
    Store,
    Topology,
    to_json,
)
from coldsnap.capsules import RECORD_NAME, CaptureRecord
from coldsnap.cli import main

SHA = "sha256:" + "0" * 64


def _identity(driver: str) -> Identity:
    return Identity(
        engine=EngineBuild("sglang", "0.5.23", "sha256:" + "c" * 64),
        plugin_digest="sha256:" + "d" * 64,
        model=ModelBinding(
            "Qwen/Qwen3-0.6B", "abc123", (FileDigest("model.safetensors", SHA, 10),),
            "bfloat16", "none", SHA,
        ),
        topology=Topology(1, 1, 0, 1),
        platform=Platform(),
        snapshot=SnapshotDriver(driver, "0.1.0"),
    )  # fmt: skip


def publish(store: Store, tag: str | None, *, driver: str = "n610", image: bytes = b"pages") -> str:
    """Publishes a capsule with a process image, a payload file and its capture record."""
    record = to_json(
        CaptureRecord(
            driver=driver, provider="native", engine="sglang", model_id="Qwen/Qwen3-0.6B",
            revision="abc123", facts={},
        )
    )  # fmt: skip
    members = (
        Member("process-image", "image/pages-1.img", store.put_bytes(image), len(image)),
        Member("payload", "payload/pack-0.bin", store.put_bytes(b"weights" * 10), 70),
        Member("record", RECORD_NAME, store.put_bytes(record), len(record)),
    )
    return store.publish(Capsule(members=members, identity=_identity(driver)), tag=tag)


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "store")


def test_ls_lists_each_capsule(store: Store) -> None:
    first = publish(store, "tiny")
    second = publish(store, None, driver="n580", image=b"other pages")
    result = cli("ls", "--store", str(store.root))
    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["TAG", "DIGEST", "SIZE", "DRIVER", "PROVIDER", "MODEL", "CREATED"]
    by_digest = {row.split()[1]: row.split() for row in rows}
    tiny = by_digest[first.removeprefix("sha256:")[:12]]
    assert tiny[0] == "tiny" and tiny[4:7] == ["n610", "native", "Qwen/Qwen3-0.6B@abc123"]
    size = sum(m.size for m in store.capsule(first).members)
    assert tiny[2:4] == [str(size), "B"] and tiny[7].endswith("Z")
    untagged = by_digest[second.removeprefix("sha256:")[:12]]
    assert untagged[0] == "-" and untagged[4] == "n580"


def test_ls_json(store: Store) -> None:
    digest = publish(store, "tiny")
    result = cli("ls", "--store", str(store.root), "--json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    size = sum(m.size for m in store.capsule(digest).members)
    assert row["tags"] == ["tiny"] and row["digest"] == digest and row["bytes"] == size
    assert (row["driver"], row["provider"], row["engine"]) == ("n610", "native", "sglang")
    assert (row["model_id"], row["revision"]) == ("Qwen/Qwen3-0.6B", "abc123")


def test_ls_of_an_empty_store(store: Store) -> None:
    result = cli("ls", "--store", str(store.root))
    assert result.exit_code == 0 and result.stdout.strip() == f"no capsules in {store.root}"


def test_ls_refuses_a_missing_store(tmp_path: Path) -> None:
    result = cli("ls", "--store", str(tmp_path / "nowhere"))
    assert result.exit_code == 2 and "does not exist" in result.output
    assert not (tmp_path / "nowhere").exists()  # nothing made


def test_show_by_tag_and_by_digest(store: Store) -> None:
    digest = publish(store, "tiny")
    result = cli("show", "tiny", "--store", str(store.root))
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert f"digest:    {digest}" in text and "tags:      tiny" in text
    assert "driver:    n610" in text and "provider:  native" in text
    assert "process-image      1 files" in text and "payload            1 files" in text
    assert "engine     sglang 0.5.23" in text and "model      Qwen/Qwen3-0.6B@abc123" in text
    assert "snapshot   n610" in text and "platform   CPU" in text
    assert cli("show", digest, "--store", str(store.root)).stdout == text


def test_show_json(store: Store) -> None:
    digest = publish(store, "tiny")
    result = cli("show", "tiny", "--store", str(store.root), "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["digest"] == digest and out["tags"] == ["tiny"]
    assert out["members"]["process-image"] == {"count": 1, "bytes": 5}
    assert out["members"]["payload"] == {"count": 1, "bytes": 70}
    assert out["identity"]["engine"]["version"] == "0.5.23"
    assert out["identity"]["snapshot"]["name"] == "n610"


def test_show_an_unknown_name_is_a_bad_request(store: Store) -> None:
    publish(store, "tiny")
    result = cli("show", "nope", "--store", str(store.root))
    assert result.exit_code == 2
    assert result.stderr == (
        f"coldsnap: bad request: field 'NAME': no tag 'nope' in {store.root} (tags: tiny)\n"
    )


def test_gc_removes_only_what_no_capsule_reaches(store: Store) -> None:
    kept = publish(store, "tiny")
    gone = publish(store, "old", image=b"old pages")
    store.unpublish("old")
    stray = store.put_bytes(b"a stray object")
    young = store.put_bytes(b"written just now")
    old = time.time() - 7200
    for digest in (stray, gone):
        os.utime(store.path(digest), (old, old))
    result = cli("gc", "--store", str(store.root), "--grace", "3600")
    assert result.exit_code == 0, result.output
    removed = {line.split()[1] for line in result.stdout.splitlines() if line.startswith("removed")}
    assert stray in removed and gone in removed
    assert young not in removed and kept not in removed
    assert store.has(young) and not store.has(stray)
    assert result.stdout.splitlines()[-1].startswith(f"gc: removed {len(removed)} objects")
    assert cli("ls", "--store", str(store.root), "--json").exit_code == 0
    assert [
        r["digest"] for r in json.loads(cli("ls", "--store", str(store.root), "--json").stdout)
    ] == [kept]
