"""Models named by Hugging Face id and revision: resolved from a real cache layout built in
tmp_path ($HF_HUB_CACHE) holding a tiny model, never from the network; refused, naming the field,
when not cached; the capsule binds the id and the snapshot's commit, never the local path."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from coldsnap.artifacts import IncompatibleArtifact, Store
from coldsnap.capsules import StoreArtifacts
from coldsnap.engines.sglang import SGLangCommandLine
from coldsnap.machine import CaptureRequest, InstalledBuild, ModelRef, RequestError, RestoreRequest
from coldsnap.machine import steps as s
from coldsnap.machine._convert import parse_request
from coldsnap.machine._models import find_snapshot

REPO = "tiny-org/tiny-llama"
OLD, NEW = "1" * 40, "a" * 40  # two commits; main and the tag v1 point to NEW


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from coldsnap.tiny_models import build_model

    return build_model(tmp_path_factory.mktemp("tiny") / "m", arch="llama", size="tiny").path


@pytest.fixture
def hub(tmp_path: Path, tiny: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Hugging Face hub cache as huggingface_hub lays it out: content in blobs/ (named by
    hash), snapshots/<commit>/ of relative links into blobs/, refs/<branch or tag> -> commit."""
    cache = tmp_path / "hub"
    repo = cache / ("models--" + REPO.replace("/", "--"))
    for commit in (OLD, NEW):
        for src in sorted(tiny.iterdir()):
            data = src.read_bytes() + (b"" if commit == NEW or src.suffix != ".json" else b" ")
            blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
            blob.parent.mkdir(parents=True, exist_ok=True)
            blob.write_bytes(data)
            link = repo / "snapshots" / commit / src.name
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(NEW)
    (repo / "refs" / "v1").write_text(NEW)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # resolution must not depend on offline mode
    return cache


class Ctx:
    """What the store's seal and admit see of a step context."""

    def __init__(self, request: Any, workdir: Path, facts: dict[str, Any], step: Any) -> None:
        self.request, self.workdir, self.step, self.facts = request, workdir, step, facts
        self.spec = SimpleNamespace(
            makes=lambda: (
                s.ENGINE_URL,
                s.RUNTIME_DIR,
                s.ACCEPTANCE_TOKENS,
                s.IMAGE_DIR,
                s.IMAGE_BYTES,
                *s.SEAL.makes,
            )
        )

    def record(self, **facts: Any) -> None:
        self.facts.update(facts)

    def carried(self) -> dict[str, Any]:
        names = {f.name for f in self.spec.makes() if f.carried}
        return {k: v for k, v in self.facts.items() if k in names}

    def advance(self, what: str, done: int, total: int, started: float) -> None:
        return None

    def check(self) -> None:
        return None


class Engine(SGLangCommandLine):
    name = "sglang"
    capabilities: frozenset[str] = frozenset()

    def build(self) -> InstalledBuild:
        digest = "sha256:" + "c0" * 32
        return InstalledBuild(engine="sglang", version="1", contract=digest, plugin_digest=digest)


def _capture(tmp_path: Path, model: dict[str, Any]) -> Any:
    return parse_request(
        {
            "kind": "coldsnap.capture-request",
            "driver": "n610",
            "provider": "native",
            "model": model,
            "workdir": str(tmp_path / "cap"),
            "store": str(tmp_path / "store"),
            "name": "cap",
        }
    )


@pytest.mark.parametrize("revision", ["main", "v1", NEW])
def test_a_hub_id_resolves_to_the_cached_snapshot_and_its_commit(
    hub: Path, tmp_path: Path, revision: str
) -> None:
    request = _capture(tmp_path, {"id": REPO, "revision": revision})
    assert isinstance(request, CaptureRequest)
    snapshot = hub / "models--tiny-org--tiny-llama" / "snapshots" / NEW
    assert request.model == ModelRef(id=REPO, revision=NEW, path=str(snapshot))
    assert json.loads((snapshot / "config.json").read_text())["architectures"]


def test_an_older_commit_resolves_to_its_own_snapshot(hub: Path) -> None:
    found = find_snapshot(REPO, OLD)
    assert found.commit == OLD and found.path.name == OLD and found.path.is_dir()


def test_resolution_never_reaches_the_network(
    hub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a network call during model resolution")

    monkeypatch.setattr(httpx.Client, "send", refuse)
    monkeypatch.setattr(httpx.AsyncClient, "send", refuse)
    assert _capture(tmp_path, {"id": REPO, "revision": "main"}).model.revision == NEW
    with pytest.raises(RequestError):
        _capture(tmp_path, {"id": "tiny-org/elsewhere", "revision": "main"})


def test_a_model_not_in_the_cache_is_refused_naming_model_path(hub: Path, tmp_path: Path):
    with pytest.raises(RequestError) as info:
        _capture(tmp_path, {"id": "tiny-org/not-here", "revision": "main"})
    assert info.value.fields == ("model.path",)
    message = str(info.value)
    assert "tiny-org/not-here" in message and str(hub) in message
    assert "hf download tiny-org/not-here --revision main" in message


def test_a_revision_not_in_the_cache_is_refused_naming_model_revision(hub: Path, tmp_path: Path):
    with pytest.raises(RequestError) as info:
        _capture(tmp_path, {"id": REPO, "revision": "v2"})
    assert info.value.fields == ("model.revision",)
    message = str(info.value)
    assert "'v2' of tiny-org/tiny-llama" in message
    assert "ref main -> aaaaaaaaaaaa" in message and "commit 111111111111" in message


def test_an_id_that_is_no_repo_id_and_no_path_is_refused_naming_model_id(
    hub: Path, tmp_path: Path
) -> None:
    with pytest.raises(RequestError) as info:
        _capture(tmp_path, {"id": "not//a repo", "revision": "main"})
    assert info.value.fields == ("model.id",)


def test_a_local_path_is_taken_as_it_is(
    hub: Path, tmp_path: Path, tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-cache-here"))
    model = {"id": REPO, "revision": "main", "path": str(tiny)}
    assert _capture(tmp_path, model).model == ModelRef(id=REPO, revision="main", path=str(tiny))


def test_a_restore_request_resolves_its_model_too(hub: Path, tmp_path: Path) -> None:
    request = RestoreRequest(
        driver="n610",
        provider="recovery",
        artifact="cap",
        workdir=str(tmp_path / "res"),
        store=str(tmp_path / "store"),
        model=ModelRef(id=REPO, revision="main"),
    )
    assert request.model is not None and request.model.revision == NEW
    assert Path(request.model.path).name == NEW


def test_the_capsule_binds_id_and_commit_and_never_the_local_path(
    hub: Path, tmp_path: Path
) -> None:
    capture = _capture(tmp_path, {"id": REPO, "revision": "main"})
    image = tmp_path / "op" / "image"
    image.mkdir(parents=True)
    (image / "core-1.img").write_bytes(b"pages")
    facts: dict[str, Any] = {
        s.ENGINE_URL.name: "http://127.0.0.1:1234",
        s.RUNTIME_DIR.name: "/run/coldsnap/engines/x",
        s.ACCEPTANCE_TOKENS.name: [1, 2, 3],
        s.IMAGE_DIR.name: str(image),
        s.IMAGE_BYTES.name: 5,
    }
    StoreArtifacts(Engine()).seal(Ctx(capture, tmp_path / "op", facts, s.SEAL))
    store = Store(tmp_path / "store")
    capsule = store.capsule(store.resolve("cap"))
    assert (capsule.identity.model.model_id, capsule.identity.model.revision) == (REPO, NEW)
    snapshot = capture.model.path
    for path in (tmp_path / "store").rglob("*"):
        if path.is_file():
            assert snapshot.encode() not in path.read_bytes(), f"{path} names the local path"

    def admit(revision: str) -> None:
        restore = RestoreRequest(
            driver="n610",
            provider="native",
            artifact="cap",
            workdir=str(tmp_path / f"res-{revision}"),
            store=str(tmp_path / "store"),
            model=ModelRef(id=REPO, revision=revision),
        )
        StoreArtifacts(Engine()).admit(Ctx(restore, Path(restore.workdir), {}, s.ADMIT))

    admit("main")  # names the branch: resolved to the same commit on this host
    with pytest.raises(IncompatibleArtifact, match=f"model.revision: expected {NEW}"):
        admit(OLD)
    shutil.rmtree(tmp_path / "store")
