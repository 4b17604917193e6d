"""Issue 16's campaign over store layouts, through admission: a store holding a sealed capsule
(image, payload, capture record, tag) damaged at a generated place (a file garbled, cut,
removed, or replaced by a directory, a FIFO or a symlink; a stray entry added) is admitted
whole or refused with a coldsnap error (ArtifactError: StoreError, IntegrityError, RecordError,
IncompatibleArtifact), never a raw OSError, KeyError or UnicodeDecodeError, and never hangs."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from coldsnap.artifacts import ArtifactError, Store

from .test_store_steps import _admit, _seal

_DIRS = ["", "objects", "objects/sha256", "capsules", "tags", "tmp"]
ADMIT_DEADLINE_S = 20.0


def _store(tmp: Path) -> Path:
    model = tmp / "model"
    model.mkdir()
    (model / "config.json").write_text('{"torch_dtype": "bfloat16"}')
    (model / "model.safetensors").write_bytes(b"weights" * 100)
    _seal(tmp, model, payload=True)
    return tmp / "store"


def _damage(store: Path, data: Any) -> str:
    files = sorted(p for p in store.rglob("*") if p.is_file() and "locks" not in p.parts)
    how = data.draw(
        st.sampled_from(["garbage", "truncate", "remove", "dir", "fifo", "symlink", "stray"]),
        label="how",
    )
    if how == "stray":
        where = store / data.draw(st.sampled_from(_DIRS), label="where")
        target = where / data.draw(st.text("abcdef0123456789xyz.-", min_size=1, max_size=66))
        if not target.exists():
            target.write_bytes(b"stray")
        return f"stray {target}"
    victim = data.draw(st.sampled_from(files), label="victim")
    before = victim.read_bytes()
    if how in ("garbage", "truncate"):
        if how == "garbage":
            after = data.draw(st.binary(max_size=64), label="bytes")
        else:
            after = before[: data.draw(st.integers(0, max(0, len(before) - 1)), label="keep")]
        if after == before:
            return "unchanged"
        victim.write_bytes(after)
    else:
        victim.unlink()
        if how == "dir":
            victim.mkdir()
        elif how == "fifo":
            os.mkfifo(victim)
        elif how == "symlink":
            elsewhere = store.parent / "elsewhere"
            elsewhere.write_bytes(b"elsewhere")
            victim.symlink_to(elsewhere)
    return f"{how} {victim.relative_to(store)}"


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_admit_of_a_damaged_store_is_whole_or_a_coldsnap_error(tmp_path_factory, data) -> None:
    tmp = tmp_path_factory.mktemp("damaged")
    what = _damage(_store(tmp), data)
    box: dict[str, Any] = {}

    def admit() -> None:
        try:
            box["facts"] = _admit(tmp).facts
        except BaseException as exc:
            box["error"] = exc

    worker = threading.Thread(target=admit, daemon=True)
    worker.start()
    worker.join(ADMIT_DEADLINE_S)
    assert not worker.is_alive(), f"admit hangs after: {what}"
    error = box.get("error")
    event(f"{what.split()[0]}: {type(error).__name__ if error else 'admitted'}")
    if error is not None:
        assert isinstance(error, ArtifactError), f"{what}: {type(error).__name__}: {error}"
        assert str(error)
        return
    # Admitted: the damage missed what admit reads and checks (the manifest, the capture
    # record, every block of the image), or hit a payload object, which stage_payload verifies.
    how, _, where = what.partition(" ")
    if how in ("garbage", "truncate") and where.startswith("objects/"):
        digest = "sha256:" + "".join(Path(where).parts[-2:])
        capsule = Store(tmp / "store").capsule("cap")
        assert {m.role for m in capsule.members if m.digest == digest} == {"payload"}, what
