"""push and pull against a real registry (Debian's docker-registry, started by the tests):
capsules made of store objects (no engine), sent, fetched into an empty store on another
root, refused when a blob in the registry is damaged (the store left exactly as it was),
resumed where a chunk or a download broke, and blobs verified on this node not hashed again."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import requests
from click.testing import CliRunner

from coldsnap.artifacts import Capsule, IntegrityError, Member, Store
from coldsnap.capsules import VerifiedObjects
from coldsnap.cli import main
from coldsnap.cli._events import schema
from coldsnap.oci import (
    ArtifactRefused,
    Note,
    RegistryError,
    Repository,
    _client,
    parse_reference,
    pull,
    push,
)

from ._server import blob_file, serve_registry

CHUNK = 64 << 10
"""Chunks this small make the 300 KiB member go up in several PATCHes."""


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_client, "CHUNK_BYTES", CHUNK)


def _capsule(root: Path, tag: str, seed: bytes) -> Capsule:
    """A published capsule of four members: a large one (several chunks), a small one twice
    (one blob), an empty one."""
    store = Store(root)
    big = b"".join(hashlib.sha256(seed + i.to_bytes(4, "big")).digest() for i in range(9600))
    contents = {"images/pages.img": big, "packs/0.pack": seed * 100, "packs/1.pack": seed * 100,
                "empty": b""}  # fmt: skip
    members = tuple(
        Member(role="pack", name=name, digest=store.put_bytes(data), size=len(data))
        for name, data in contents.items()
    )
    capsule = Capsule(members=members)
    store.publish(capsule, tag=tag)
    return capsule


def _snapshot(root: Path) -> dict[str, Any]:
    """Every file and folder under `root`, with its mode and bytes' digest."""
    if not root.exists():
        return {}
    found: dict[str, Any] = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
        found[str(path.relative_to(root))] = (st.st_mode, st.st_size if digest else 0, digest)
    return found


def _repo(registry: str, name: str) -> tuple[Any, Repository]:
    ref = parse_reference(f"{registry}/coldsnap/{name}:v1")
    return ref, Repository(ref, plain_http=True)


def test_pushed_then_pulled_into_an_empty_store_on_another_root(
    registry: str, tmp_path: Path
) -> None:
    capsule = _capsule(tmp_path / "a", "tiny", b"one")
    ref, repo = _repo(registry, "roundtrip")
    notes: list[Note] = []
    pushed = push(Store.open(tmp_path / "a"), "tiny", ref, repo, notes.append)
    assert pushed.sent.count == 4  # config, big, small (twice in the capsule), empty
    assert pushed.present.count == 0
    assert [n.step for n in notes if n.phase == "done"] == ["resolve", "check", "send", "manifest"]
    progress = [n.facts for n in notes if n.phase == "progress"]
    assert progress and progress[-1] == {"bytes": pushed.sent.bytes, "of": pushed.sent.bytes}

    again: list[Note] = []
    assert push(Store.open(tmp_path / "a"), "tiny", ref, repo, again.append).sent.count == 0
    assert [(n.step, n.detail) for n in again if n.phase == "skipped"] == [
        ("send", f"{registry}/coldsnap/roundtrip holds every blob")
    ]

    verified = VerifiedObjects(tmp_path / "verified")
    pulled = pull(tmp_path / "b", ref, repo, lambda n: None, verified=verified)
    store = Store.open(tmp_path / "b")
    assert pulled.tag == "tiny" and pulled.capsule == pushed.capsule
    assert store.capsule("tiny") == capsule and store.resolve("tiny") == pushed.capsule
    assert store.verify().ok
    assert pulled.fetched.count == 3 and pulled.known.count == pulled.rehashed.count == 0
    # every object fetched is on this node's record: a restore does not hash it again
    for member in capsule.members:
        assert verified.unchanged(member.digest, store.path(member.digest)), member.name


def test_a_corrupted_blob_in_the_registry_is_refused_and_the_store_left_as_it_was(
    registry: str, registry_root: Path, tmp_path: Path
) -> None:
    capsule = _capsule(tmp_path / "a", "tiny", b"two")
    ref, repo = _repo(registry, "damaged")
    push(Store.open(tmp_path / "a"), "tiny", ref, repo, lambda n: None)
    damaged = capsule.member("images/pages.img")
    data = bytearray(blob_file(registry_root, damaged.digest).read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte changed
    blob_file(registry_root, damaged.digest).write_bytes(bytes(data))

    # into a store that holds another capsule: nothing of the pull stays, not a temporary
    other = tmp_path / "other"
    _capsule(other, "mine", b"three")
    before = _snapshot(other)
    verified = VerifiedObjects(tmp_path / "verified")
    with pytest.raises(ArtifactRefused, match=r"member images/pages\.img.*hashes to"):
        pull(other, ref, repo, lambda n: None, verified=verified)
    assert _snapshot(other) == before
    # into no store at all (nor its folder): none is left behind
    with pytest.raises(ArtifactRefused, match="store left as it was"):
        pull(tmp_path / "new" / "store", ref, repo, lambda n: None, verified=verified)
    assert not (tmp_path / "new").exists()


def test_a_blob_verified_on_this_node_is_not_hashed_again_while_unchanged(
    registry: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    capsule = _capsule(tmp_path / "a", "tiny", b"four")
    ref, repo = _repo(registry, "known")
    push(Store.open(tmp_path / "a"), "tiny", ref, repo, lambda n: None)
    verified = VerifiedObjects(tmp_path / "verified")
    pull(tmp_path / "b", ref, repo, lambda n: None, verified=verified)

    hashed: list[str] = []
    real = Store.verify_object
    monkeypatch.setattr(Store, "verify_object", lambda s, d: (hashed.append(d), real(s, d))[1])
    again = pull(tmp_path / "b", ref, repo, lambda n: None, name="again", verified=verified)
    assert again.known.count == 3 and again.rehashed.count == 0 and again.fetched.count == 0
    assert hashed == []

    touched = Store.open(tmp_path / "b").path(capsule.member("packs/0.pack").digest)
    os.utime(touched)  # as a write would: its stamp no longer matches the record
    third = pull(tmp_path / "b", ref, repo, lambda n: None, name="third", verified=verified)
    assert third.rehashed.count == 1 and third.known.count == 2
    assert hashed == [capsule.member("packs/0.pack").digest]


def test_a_damaged_object_the_store_holds_refuses_the_pull(registry: str, tmp_path: Path) -> None:
    """An object the store already holds is hashed before it is taken (it is on no record of
    this node): bytes that no longer match its name refuse the pull, nothing else changed."""
    capsule = _capsule(tmp_path / "a", "tiny", b"nine")
    ref, repo = _repo(registry, "held")
    push(Store.open(tmp_path / "a"), "tiny", ref, repo, lambda n: None)
    store = Store.open(tmp_path / "a")
    store.untag("tiny")
    held = store.path(capsule.member("packs/0.pack").digest)
    held.write_bytes(b"x" * held.stat().st_size)
    before = _snapshot(tmp_path / "a")
    with pytest.raises(IntegrityError, match="is corrupt"):
        pull(tmp_path / "a", ref, repo, lambda n: None, verified=VerifiedObjects(tmp_path / "v"))
    assert _snapshot(tmp_path / "a") == before


def test_a_failed_chunk_resumes_from_the_offset_the_registry_holds(
    registry: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second PATCH fails before it is sent: the upload asks the session where it stands
    and sends that chunk again. The fourth reaches the registry but its answer is lost: the
    session's URL is then stale (distribution refuses it), and the blob starts over in a new
    session. The blob arrives whole either way."""
    capsule = _capsule(tmp_path / "a", "tiny", b"five")
    ref, repo = _repo(registry, "resumed")
    real = Repository._request
    patches: list[str] = []

    def flaky(self: Repository, method: str, url: str, **kw: Any) -> requests.Response:
        if method == "PATCH":
            patches.append(kw["headers"]["Content-Range"])
            if len(patches) == 2:
                raise RegistryError("connection reset")
            if len(patches) == 4:
                real(self, method, url, **kw)
                raise RegistryError("answer lost")
        return real(self, method, url, **kw)

    monkeypatch.setattr(Repository, "_request", flaky)
    notes: list[Note] = []
    pushed = push(Store.open(tmp_path / "a"), "tiny", ref, repo, notes.append)
    chunk = [f"{i * CHUNK}-{(i + 1) * CHUNK - 1}" for i in range(4)]
    assert patches[:7] == [chunk[0], chunk[1], chunk[1], chunk[2], chunk[0], chunk[1], chunk[2]]
    counted = [n.facts for n in notes if n.phase == "progress"][-1]
    assert counted == {"bytes": pushed.sent.bytes, "of": pushed.sent.bytes}  # each byte once
    monkeypatch.setattr(Repository, "_request", real)
    pull(tmp_path / "b", ref, repo, lambda n: None, verified=VerifiedObjects(tmp_path / "v"))
    assert Store.open(tmp_path / "b").capsule("tiny") == capsule
    assert Store.open(tmp_path / "b").verify().ok


def test_a_broken_download_resumes_with_a_range_request(
    registry: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    capsule = _capsule(tmp_path / "a", "tiny", b"six")
    ref, repo = _repo(registry, "ranged")
    push(Store.open(tmp_path / "a"), "tiny", ref, repo, lambda n: None)
    real = Repository._request
    ranges: list[str] = []
    broken = [False]

    def flaky(self: Repository, method: str, url: str, **kw: Any) -> requests.Response:
        answer = real(self, method, url, **kw)
        if "Range" in kw.get("headers", {}):
            ranges.append(kw["headers"]["Range"])
        big = capsule.member("images/pages.img").digest
        if method == "GET" and url.endswith(big) and not broken[0]:
            broken[0] = True
            pieces = answer.iter_content

            def first_then_break(size: int) -> Any:
                yield next(pieces(size))[:1000]
                raise requests.ConnectionError("stream broke")

            answer.iter_content = first_then_break  # type: ignore[method-assign]
        return answer

    monkeypatch.setattr(Repository, "_request", flaky)
    verified = VerifiedObjects(tmp_path / "v")
    pulled = pull(tmp_path / "b", ref, repo, lambda n: None, verified=verified)
    assert broken[0] and ranges == ["bytes=1000-"]
    assert pulled.fetched.count == 3 and Store.open(tmp_path / "b").verify().ok


def test_the_commands_push_and_pull_with_json_events(registry: str, tmp_path: Path) -> None:
    _capsule(tmp_path / "a", "tiny", b"seven")
    ref = f"{registry}/coldsnap/cli:v1"
    runner = CliRunner()
    done = runner.invoke(main, ["push", "tiny", ref, "--store", str(tmp_path / "a"),
                                "--plain-http"])  # fmt: skip
    assert done.exit_code == 0, done.output
    result = json.loads(done.output.strip().splitlines()[-1])
    assert result["outcome"] == "done" and result["sent"]["count"] == 4
    assert f"pushed tiny ({result['capsule']}) to {ref}" in done.output

    pulled = runner.invoke(main, ["pull", ref, "--store", str(tmp_path / "b"), "--plain-http",
                                  "--json", "--name", "copy"])  # fmt: skip
    assert pulled.exit_code == 0, pulled.output
    events = [json.loads(line) for line in pulled.output.strip().splitlines()]
    for event in events:  # the lines capture and restore print: `coldsnap schema event`
        jsonschema.validate(event, schema())
    assert [e["step"] for e in events if e["event"] == "step_ended"] == [
        "manifest", "config", "present", "fetch", "publish"
    ]  # fmt: skip
    assert events[-1]["event"] == "finished" and events[-1]["status"] == "done"
    assert events[-1]["result"]["tag"] == "copy"
    assert events[-1]["result"]["capsule"] == result["capsule"]
    assert Store.open(tmp_path / "b").resolve("copy") == result["capsule"]

    bad = runner.invoke(main, ["pull", "tiny", "--store", str(tmp_path / "c")])
    assert bad.exit_code == 2 and "field 'REF'" in bad.output
    unknown = runner.invoke(main, ["pull", f"{registry}/coldsnap/none:v1", "--plain-http",
                                   "--store", str(tmp_path / "c")])  # fmt: skip
    assert unknown.exit_code == 1 and "MANIFEST_UNKNOWN" in unknown.output
    assert not (tmp_path / "c").exists()


def test_credentials_are_read_from_the_docker_config_as_docker_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A registry that asks for a login (Basic): without credentials the push says what is
    missing; with `$DOCKER_CONFIG/config.json` holding them (as `docker login` writes it),
    push and pull go through."""
    capsule = _capsule(tmp_path / "a", "tiny", b"eight")
    monkeypatch.delenv("ORAS_USER", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.docker/config.json of the host's
    with serve_registry(tmp_path / "registry", login=("ci", "s3cret")) as host:
        ref = parse_reference(f"{host}/coldsnap/private:v1")
        monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
        with pytest.raises(RegistryError, match="asks for credentials and none were found"):
            Repository(ref, plain_http=True)
        (tmp_path / "docker").mkdir()
        auth = base64.b64encode(b"ci:wrong").decode()
        config = tmp_path / "docker" / "config.json"
        config.write_text(json.dumps({"auths": {host: {"auth": auth}}}))
        with pytest.raises(RegistryError, match="HTTP 401"):
            push(Store.open(tmp_path / "a"), "tiny", ref, Repository(ref, plain_http=True),
                 lambda n: None)  # fmt: skip
        auth = base64.b64encode(b"ci:s3cret").decode()
        config.write_text(json.dumps({"auths": {host: {"auth": auth}}}))
        repo = Repository(ref, plain_http=True)
        push(Store.open(tmp_path / "a"), "tiny", ref, repo, lambda n: None)
        pull(tmp_path / "b", ref, repo, lambda n: None, verified=VerifiedObjects(tmp_path / "v"))
    assert Store.open(tmp_path / "b").capsule("tiny") == capsule
