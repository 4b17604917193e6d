"""StoreArtifacts on a fake step context: seal keeps the spec's carried facts and nothing else,
records what a rollback needs before it publishes, unpublish undoes it, and admit lays the
capsule out or refuses it, naming why."""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from coldsnap.artifacts import IncompatibleArtifact, Store, to_json
from coldsnap.capsules import CaptureRecord, StoreArtifacts, _steps
from coldsnap.engines.sglang import SGLangCommandLine
from coldsnap.machine import Fact, InstalledBuild, Skipped
from coldsnap.machine import steps as s

CONTRACT = "sha256:" + "c0" * 32
PLUGIN = "sha256:" + "d0" * 32
# A driver's carried fact, declared the way a driver's spec module declares one (not
# registered globally): the store must keep it without knowing the driver.
DRIVER_FACT = Fact("toy_driver_secret", "what the toy driver carries", carried=True)
NOT_CARRIED = Fact("toy_scratch", "a fact that stays with the capture")


class Ctx:
    """What a step sees of StepContext: the request, the spec, the facts, record()."""

    def __init__(self, request: Any, workdir: Path, facts: dict[str, Any], step: Any) -> None:
        self.request = request
        self.workdir = workdir
        self.step = step
        self.spec = SimpleNamespace(
            makes=lambda: (
                s.ENGINE_URL,
                s.RUNTIME_DIR,
                s.ACCEPTANCE_TOKENS,
                s.IMAGE_DIR,
                s.IMAGE_BYTES,
                DRIVER_FACT,
                NOT_CARRIED,
                *s.SEAL.makes,
            )
        )
        self._facts = facts
        self.recorded: list[dict[str, Any]] = []
        self.advanced: list[tuple[str, int, int]] = []

    @property
    def facts(self) -> dict[str, Any]:
        return self._facts

    def carried(self) -> dict[str, Any]:
        names = {f.name for f in self.spec.makes() if f.carried}
        return {name: value for name, value in self._facts.items() if name in names}

    def record(self, **facts: Any) -> None:
        self.recorded.append(facts)
        self._facts.update(facts)

    def advance(self, what: str, done: int, total: int, started: float) -> None:
        self.advanced.append((what, done, total))

    def check(self) -> None:
        return None


class Engine(SGLangCommandLine):
    """An engine adapter with SGLang's launch-line policy (which engine arguments bind)."""

    name = "toy"
    capabilities: frozenset[str] = frozenset()

    def __init__(self, version: str = "1") -> None:
        self.version = version

    def build(self) -> InstalledBuild:
        return InstalledBuild(
            engine="toy", version=self.version, contract=CONTRACT, plugin_digest=PLUGIN
        )


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text('{"torch_dtype": "bfloat16"}')
    (path / "model.safetensors").write_bytes(b"weights" * 100)
    return path


def _capture_request(
    tmp_path: Path,
    model: Path,
    name: str = "cap",
    engine_args: tuple[str, ...] = (),
    engine_options: dict[str, str] | None = None,
) -> SimpleNamespace:
    return SimpleNamespace(
        driver="n610",
        provider="native",
        engine="toy",
        name=name,
        tp=1,
        store=str(tmp_path / "store"),
        model=SimpleNamespace(id="org/toy", revision="r1", path=str(model)),
        engine_args=engine_args,
        engine_options=dict(engine_options or {}),
    )


def _restore_request(tmp_path: Path, **changes: Any) -> SimpleNamespace:
    fields = dict(
        driver="n610",
        provider="native",
        engine="toy",
        artifact="cap",
        store=str(tmp_path / "store"),
        model=None,
        tp=None,
        engine_args=(),
        engine_options={},
    )
    fields.update(changes)
    return SimpleNamespace(**fields)


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def _seal(
    tmp_path: Path,
    model: Path,
    *,
    payload: bool,
    name: str = "cap",
    image: bytes = b"pages",
    engine_args: tuple[str, ...] = (),
    engine_options: dict[str, str] | None = None,
) -> Ctx:
    op = tmp_path / f"op-{name}-{hashlib.sha256(image).hexdigest()[:16]}"
    facts: dict[str, Any] = {
        s.ENGINE_URL.name: "http://127.0.0.1:1234",
        s.RUNTIME_DIR.name: "/run/coldsnap/engines/x",
        s.ACCEPTANCE_TOKENS.name: [1, 2, 3],
        s.IMAGE_DIR.name: str(_tree(op / "image", {"core-1.img": image, "sub/pages.img": b"p"})),
        s.IMAGE_BYTES.name: len(image) + 1,
        DRIVER_FACT.name: {"pid": 42},
        NOT_CARRIED.name: "scratch",
        s.ENGINE_PID.name: 42,
    }
    if payload:
        files = {"tp0/weights/index.json": b"{}", "tp0/weights/ab.pack": b"pack"}
        facts[s.PAYLOAD_DIR.name] = str(_tree(op / "payload", files))
    request = _capture_request(tmp_path, model, name, engine_args, engine_options)
    ctx = Ctx(request, op, facts, s.SEAL)
    made = StoreArtifacts(Engine()).seal(ctx)
    declared = {f.name for f in s.SEAL.makes}
    assert set(made) | {k for r in ctx.recorded for k in r} == declared
    ctx.facts.update(made)
    return ctx


def _admit(tmp_path: Path, adapter: Engine | None = None, **req: Any) -> Ctx:
    ctx = Ctx(_restore_request(tmp_path, **req), tmp_path / "res", {}, s.ADMIT)
    ctx.facts.update(StoreArtifacts(adapter or Engine()).admit(ctx))
    return ctx


def test_seal_records_what_a_rollback_needs_before_it_publishes(tmp_path: Path, model: Path):
    ctx = _seal(tmp_path, model, payload=False)
    assert len(ctx.recorded) == 1
    early = ctx.recorded[0]
    assert set(early) == {s.CAPSULE_DIGEST.name, s.CAPSULE_CREATED.name, s.CAPSULE_TAG_WAS.name}
    assert early[s.CAPSULE_CREATED.name] is True and early[s.CAPSULE_TAG_WAS.name] is None
    store = Store(tmp_path / "store")
    assert store.tags() == {"cap": early[s.CAPSULE_DIGEST.name]}
    assert not any(Path(ctx.facts[s.IMAGE_DIR.name]).rglob("*.img")), "image files not adopted"


def test_admit_gives_back_exactly_the_carried_facts(tmp_path: Path, model: Path) -> None:
    sealed = _seal(tmp_path, model, payload=False)
    ctx = _admit(tmp_path)
    assert ctx.facts[s.CAPSULE_DIGEST.name] == sealed.facts[s.CAPSULE_DIGEST.name]
    assert ctx.facts[s.CAPSULE.name] == {
        s.ENGINE_URL.name: "http://127.0.0.1:1234",
        s.RUNTIME_DIR.name: "/run/coldsnap/engines/x",
        s.ACCEPTANCE_TOKENS.name: [1, 2, 3],
        s.IMAGE_BYTES.name: 6,
        DRIVER_FACT.name: {"pid": 42},
        "driver": "n610",
        "model_id": "org/toy",
    }
    assert s.PAYLOAD_DIR.name not in ctx.facts  # no payload sealed, none laid out
    assert set(ctx.facts) <= {f.name for f in s.ADMIT.makes}
    image = Path(ctx.facts[s.IMAGE_DIR.name])
    assert (image / "core-1.img").read_bytes() == b"pages"
    assert (image / "sub" / "pages.img").read_bytes() == b"p"
    assert (image / "core-1.img").stat().st_nlink == 2  # a hard link to the store's object
    pinned = ctx.facts[s.CAPSULE_CHECKPOINT.name]
    assert set(pinned) == {"config.json", "model.safetensors"}


def test_a_payload_is_sealed_and_laid_out_when_an_earlier_step_made_one(
    tmp_path: Path, model: Path
) -> None:
    _seal(tmp_path, model, payload=True)
    ctx = _admit(tmp_path)
    payload = Path(ctx.facts[s.PAYLOAD_DIR.name])
    assert (payload / "tp0" / "weights" / "ab.pack").read_bytes() == b"pack"
    assert set(ctx.facts) == {f.name for f in s.ADMIT.makes}


def test_a_retried_admit_keeps_what_the_first_laid_out(tmp_path: Path, model: Path) -> None:
    _seal(tmp_path, model, payload=True)
    first = _admit(tmp_path)
    second = _admit(tmp_path)
    timed = s.VERIFY_IMAGE_SECONDS.name  # each admit verifies again and times it
    assert {k: v for k, v in first.facts.items() if k != timed} == {
        k: v for k, v in second.facts.items() if k != timed
    }


def test_unpublish_removes_the_capsule_and_gives_the_tag_back(tmp_path: Path, model: Path):
    before = _seal(tmp_path, model, payload=False, image=b"first")
    after = _seal(tmp_path, model, payload=False, image=b"second")
    assert after.recorded[0][s.CAPSULE_TAG_WAS.name] == before.facts[s.CAPSULE_DIGEST.name]
    store = Store(tmp_path / "store")
    StoreArtifacts(Engine()).unpublish(after)
    assert after.facts[s.CAPSULE_DIGEST.name] not in store.capsules()
    assert store.tags() == {"cap": before.facts[s.CAPSULE_DIGEST.name]}


def test_unpublish_leaves_a_capsule_that_existed_before(tmp_path: Path, model: Path) -> None:
    first = _seal(tmp_path, model, payload=False, image=b"same")
    again = _seal(tmp_path, model, payload=False, image=b"same")
    assert again.recorded[0][s.CAPSULE_CREATED.name] is False
    StoreArtifacts(Engine()).unpublish(again)
    assert first.facts[s.CAPSULE_DIGEST.name] in Store(tmp_path / "store").capsules()


def test_unpublish_before_a_digest_was_chosen_touches_nothing(tmp_path: Path, model: Path):
    ctx = Ctx(_capture_request(tmp_path, model), tmp_path, {}, s.SEAL)
    assert StoreArtifacts(Engine()).unpublish(ctx) is None
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("field", ["driver", "provider", "engine"])
def test_admit_refuses_a_capsule_of_another_component(
    tmp_path: Path, model: Path, field: str
) -> None:
    _seal(tmp_path, model, payload=False)
    with pytest.raises(IncompatibleArtifact) as info:
        _admit(tmp_path, **{field: "other"})
    assert [d.field for d in info.value.differences] == [field]
    assert not (tmp_path / "res").exists()


def test_admit_refuses_another_engine_build(tmp_path: Path, model: Path) -> None:
    _seal(tmp_path, model, payload=False)
    with pytest.raises(IncompatibleArtifact, match=r"engine\.version"):
        _admit(tmp_path, Engine(version="2"))


def test_seal_refuses_a_missing_image(tmp_path: Path, model: Path) -> None:
    from coldsnap.artifacts import StoreError

    facts = {s.IMAGE_DIR.name: str(tmp_path / "nowhere")}
    ctx = Ctx(_capture_request(tmp_path, model), tmp_path, facts, s.SEAL)
    with pytest.raises(StoreError, match="not a directory"):
        StoreArtifacts(Engine()).seal(ctx)
    assert ctx.recorded == []


def test_the_capture_record_round_trips(tmp_path: Path, model: Path) -> None:
    from coldsnap.capsules import read_record

    record = CaptureRecord(
        driver="n580", provider="recovery", engine="toy", model_id="m", revision="r",
        facts={"template_id": "t"},
    )  # fmt: skip
    assert read_record(to_json(record)) == record


@pytest.fixture
def linked(tmp_path: Path) -> Iterator[tuple[Store, Any]]:
    store = Store(tmp_path / "store")
    digest = store.put_bytes(b"object")
    yield store, [_steps.Member("process-image", "image/a.img", digest, 6)]


def test_layout_copies_across_filesystems(linked: Any, tmp_path: Path, monkeypatch) -> None:
    store, members = linked

    def cross_device(src: Any, dst: Any) -> None:
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(_steps.os, "link", cross_device)
    dest = _steps._link_tree(store, members, "image", tmp_path / "out")
    assert (dest / "a.img").read_bytes() == b"object"
    assert [p.name for p in dest.iterdir()] == ["a.img"]  # no partial file left


def test_layout_fails_on_any_other_link_error(linked: Any, tmp_path: Path, monkeypatch):
    store, members = linked

    def denied(src: Any, dst: Any) -> None:
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(_steps.os, "link", denied)
    with pytest.raises(PermissionError):
        _steps._link_tree(store, members, "image", tmp_path / "out")


# -- every image member verified at admission; the request's model and
# topology compared with what the capsule binds (item 10) -------------------------------------


def _image_object(tmp_path: Path, member: str = "image/core-1.img") -> Path:
    store = Store(tmp_path / "store")
    capsule = store.capsule("cap")
    (found,) = [m for m in capsule.members if m.name == member]
    return store.path(found.digest)


def _flip(path: Path, offset: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: _flip(p),
        lambda p: _flip(p, offset=-1),
        lambda p: p.write_bytes(p.read_bytes()[:-1]),
        lambda p: p.write_bytes(p.read_bytes() + b"x"),
    ],
    ids=["first-byte", "last-byte", "truncated", "extended"],
)
def test_admit_refuses_a_damaged_image_member(tmp_path: Path, model: Path, damage) -> None:
    from coldsnap.artifacts import IntegrityError

    _seal(tmp_path, model, payload=False, image=b"pages" * 1000)
    damage(_image_object(tmp_path))
    with pytest.raises(IntegrityError, match=r"image/core-1\.img"):
        _admit(tmp_path)
    assert not (tmp_path / "res" / "image").exists(), "no unverified image is left laid out"


def test_admit_refuses_a_damaged_member_it_laid_out_before(tmp_path: Path, model: Path) -> None:
    """A retried admit keeps files laid out before, but verifies them again."""
    from coldsnap.artifacts import IntegrityError

    _seal(tmp_path, model, payload=False, image=b"pages" * 1000)
    ctx = _admit(tmp_path)
    _flip(Path(ctx.facts[s.IMAGE_DIR.name]) / "sub" / "pages.img")
    with pytest.raises(IntegrityError, match=r"image/sub/pages\.img"):
        _admit(tmp_path)


@pytest.fixture
def small_blocks(monkeypatch) -> int:
    from coldsnap.artifacts import _capsule

    monkeypatch.setattr(_capsule, "BLOCK_BYTES", 1024)
    monkeypatch.setattr(_steps, "BLOCK_BYTES", 1024)
    return 1024


def test_admit_verifies_each_block_on_many_threads(
    tmp_path: Path, model: Path, monkeypatch, small_blocks: int
) -> None:
    import threading

    seen: list[tuple[str, int]] = []
    real = _steps._hash_block

    def spy(path: Path, block: int) -> str:
        seen.append((threading.current_thread().name, block))
        return real(path, block)

    _seal(tmp_path, model, payload=False, image=b"pages" * 1000)  # 5000 bytes: 5 blocks
    image = Store(tmp_path / "store").capsule("cap").member("image/core-1.img")
    assert len(image.blocks) == 5
    monkeypatch.setattr(_steps, "_hash_block", spy)
    _admit(tmp_path)
    assert sorted(b for _, b in seen) == [0, 0, 1, 2, 3, 4]  # and the 1-byte sub/pages.img
    assert all(name.startswith("coldsnap-verify") for name, _ in seen)


def test_admit_names_the_damaged_block(tmp_path: Path, model: Path, small_blocks: int) -> None:
    from coldsnap.artifacts import IntegrityError

    _seal(tmp_path, model, payload=False, image=b"pages" * 1000)
    _flip(_image_object(tmp_path), offset=3 * 1024 + 7)
    with pytest.raises(IntegrityError, match=r"image/core-1\.img'?: block 3 "):
        _admit(tmp_path)


def _model(model: Path, **changes: str) -> SimpleNamespace:
    fields = {"id": "org/toy", "revision": "r1", "path": str(model)}
    fields.update(changes)
    return SimpleNamespace(**fields)


@pytest.mark.parametrize(
    ("changes", "field", "captured", "asked"),
    [
        ({"revision": "r2"}, "model.revision", "r1", "r2"),
        ({"id": "org/other"}, "model.id", "org/toy", "org/other"),
    ],
)
def test_admit_refuses_a_request_for_another_model(
    tmp_path: Path, model: Path, changes, field, captured, asked
) -> None:
    _seal(tmp_path, model, payload=False)
    with pytest.raises(IncompatibleArtifact) as info:
        _admit(tmp_path, model=_model(model, **changes))
    assert [(d.field, d.expected, d.found) for d in info.value.differences] == [
        (field, captured, asked)
    ]
    assert f"{field}: expected {captured}, found {asked}" in str(info.value)
    assert not (tmp_path / "res").exists()


def test_admit_refuses_a_request_for_another_topology(tmp_path: Path, model: Path) -> None:
    _seal(tmp_path, model, payload=False)
    with pytest.raises(IncompatibleArtifact, match="tp: expected 1, found 2"):
        _admit(tmp_path, tp=2)
    assert not (tmp_path / "res").exists()


def test_admit_takes_a_request_for_the_captured_model(tmp_path: Path, model: Path) -> None:
    _seal(tmp_path, model, payload=False)
    assert _admit(tmp_path, model=_model(model), tp=1).facts[s.IMAGE_DIR.name]


def test_admit_reports_the_seconds_it_spent_verifying_the_image(
    tmp_path: Path, model: Path
) -> None:
    """The restore benchmark reports verification's cost: admit makes `verify_image_seconds`
    (declared in ADMIT.makes), and the double's admit makes it too."""
    import inspect

    from coldsnap.testing._doubles import MemoryStore

    assert s.VERIFY_IMAGE_SECONDS in s.ADMIT.makes
    _seal(tmp_path, model, payload=False)
    ctx = _admit(tmp_path)
    seconds = ctx.facts[s.VERIFY_IMAGE_SECONDS.name]
    assert isinstance(seconds, float) and 0.0 <= seconds < 60.0
    assert "VERIFY_IMAGE_SECONDS" in inspect.getsource(MemoryStore.admit)


CAPTURED_ARGS = ("--dtype", "float16", "--mem-fraction-static", "0.5", "--log-level", "info")


@pytest.mark.parametrize(
    ("asked", "field", "captured", "found"),
    [
        (
            ("--dtype", "bfloat16", "--mem-fraction-static", "0.5"),
            "engine_args --dtype",
            "--dtype float16",
            "--dtype bfloat16",
        ),
        (
            ("--dtype", "float16"),
            "engine_args --mem-fraction-static",
            "--mem-fraction-static 0.5",
            "absent",
        ),
        (
            (*CAPTURED_ARGS, "--context-length", "64"),
            "engine_args --context-length",
            "absent",
            "--context-length 64",
        ),
    ],
)
def test_admit_refuses_engine_args_that_change_the_engine(
    tmp_path: Path, model: Path, asked, field, captured, found
) -> None:
    _seal(tmp_path, model, payload=False, engine_args=CAPTURED_ARGS)
    with pytest.raises(IncompatibleArtifact) as info:
        _admit(tmp_path, engine_args=asked)
    assert [(d.field, d.expected, d.found) for d in info.value.differences] == [
        (field, captured, found)
    ]
    assert f"{field}: expected {captured}, found {found}" in str(info.value)
    assert not (tmp_path / "res").exists()


@pytest.mark.parametrize(
    "asked",
    [
        CAPTURED_ARGS,
        ("--mem-fraction-static=0.5", "--dtype", "float16"),  # order, '=' and logging
        ("--log-level", "debug", "--dtype=float16", "--mem-fraction-static", "0.5"),
        (*CAPTURED_ARGS, "--enable-metrics", "--log-requests"),
    ],
)
def test_admit_takes_engine_args_that_differ_only_in_reporting(
    tmp_path: Path, model: Path, asked
) -> None:
    _seal(tmp_path, model, payload=False, engine_args=CAPTURED_ARGS)
    assert _admit(tmp_path, engine_args=asked).facts[s.IMAGE_DIR.name]


CAPTURED_OPTIONS = {"cuda_graphs_in_saver": "1", "keep_residual": "0", "rank_timeout_s": "60"}


@pytest.mark.parametrize(
    ("asked", "field", "captured", "found"),
    [
        ({**CAPTURED_OPTIONS, "keep_residual": "1"}, "engine_options.keep_residual", False, True),
        (
            {"keep_residual": "0", "rank_timeout_s": "60"},
            "engine_options.cuda_graphs_in_saver",
            True,
            False,
        ),
        (
            {**CAPTURED_OPTIONS, "live_backing": "cpu"},
            "engine_options.live_backing",
            "discard",
            "cpu",
        ),
    ],
)
def test_admit_refuses_engine_options_the_capsule_binds(
    tmp_path: Path, model: Path, asked, field, captured, found
) -> None:
    _seal(tmp_path, model, payload=False, engine_options=CAPTURED_OPTIONS)
    with pytest.raises(IncompatibleArtifact) as info:
        _admit(tmp_path, engine_options=asked)
    assert [(d.field, d.expected, d.found) for d in info.value.differences] == [
        (field, captured, found)
    ]
    assert not (tmp_path / "res").exists()


def test_admit_takes_the_same_engine_options_spelled_otherwise(tmp_path: Path, model: Path) -> None:
    _seal(tmp_path, model, payload=False, engine_options=CAPTURED_OPTIONS)
    asked = {"rank_timeout_s": "60.0", "keep_residual": "false", "cuda_graphs_in_saver": "on"}
    assert _admit(tmp_path, engine_options=asked).facts[s.IMAGE_DIR.name]


def test_a_capture_record_binds_its_engine_args_and_refuses_format_1(
    tmp_path: Path, model: Path
) -> None:
    import json

    from coldsnap.artifacts import RecordError
    from coldsnap.capsules import read_record

    record = CaptureRecord(
        driver="n610", provider="native", engine="toy", model_id="m", revision="r", facts={},
        engine_args=("--dtype", "float16"),
    )  # fmt: skip
    data = json.loads(to_json(record))
    assert read_record(json.dumps(data)) == record
    old = {k: v for k, v in data.items() if k != "engine_args"} | {"format": 1}
    with pytest.raises(RecordError, match=r"format: expected one of \[2, 3, 4\], found 1"):
        read_record(json.dumps(old))
    with pytest.raises(RecordError, match="engine_args: expected a list of strings"):
        read_record(json.dumps(data | {"engine_args": "--dtype float16"}))


def test_a_capture_record_binds_its_engine_options_from_format_4() -> None:
    import json

    from coldsnap.artifacts import RecordError
    from coldsnap.capsules import read_record

    record = CaptureRecord(
        driver="n610", provider="native", engine="toy", model_id="m", revision="r", facts={},
        engine_options={"keep_residual": "0"},
    )  # fmt: skip
    data = json.loads(to_json(record))
    assert data["format"] == 4 and read_record(json.dumps(data)) == record
    with pytest.raises(RecordError, match="engine_options"):
        read_record(json.dumps(data | {"format": 3}))
    with pytest.raises(RecordError, match="engine_options"):
        read_record(json.dumps(data | {"engine_options": {"keep_residual": 0}}))


def test_discard_layout_undoes_admit_and_keeps_the_store(tmp_path: Path, model: Path) -> None:
    """The compensation admit needs (its spec step must name it): a rolled-back restore leaves
    no laid-out image or payload in its workdir, and the capsule stays whole in the store."""
    _seal(tmp_path, model, payload=True)
    ctx = _admit(tmp_path)
    assert (tmp_path / "res" / "image").is_dir() and (tmp_path / "res" / "payload").is_dir()
    artifacts = StoreArtifacts(Engine())
    assert artifacts.discard_layout(ctx) is None
    again = artifacts.discard_layout(ctx)  # idempotent, and says it had nothing to do
    assert isinstance(again, Skipped) and "nothing is laid out" in again.reason
    assert sorted(p.name for p in (tmp_path / "res").iterdir()) == []
    store = Store(tmp_path / "store")
    store.verify()
    assert _admit(tmp_path).facts[s.IMAGE_DIR.name]


def test_seal_and_admit_show_their_bytes_as_they_go(tmp_path: Path, model: Path) -> None:
    """Seal counts every byte it takes in (image and payload) and every image block it hashes;
    admit every byte it verifies (image and payload): each meter ends at its total."""
    sealed = _seal(tmp_path, model, payload=True)
    image, payload = len(b"pages") + len(b"p"), len(b"{}") + len(b"pack")  # as _seal lays out
    ends = {what: (done, total) for what, done, total in sealed.advanced}
    assert ends == {"sealed": (image + payload,) * 2, "hashed image blocks": (image, image)}
    admitted = _admit(tmp_path)
    assert admitted.advanced[-1] == ("verified", image + payload, image + payload)
