"""A real SGLang server on CPU, captured and restored with both drivers and both providers.

One module, one server at a time, each stopped before the next starts:
- a plain cold server (no plugin) answers a fixed prompt set greedily: the reference;
- for n610 native and n580 native and recovery: capture, then restore the one capsule twice
  (the second after the first is stopped); every restore answers like the cold server, token
  for token, and leaves no process behind. The n610 native capsule is the session's
  command-line capture of the same model (conftest's `cli_capsule`, whose workdir is gone
  already), restored from a copy of its store: one server start fewer. n610 recovery is left
  out to keep `make test` in its time: its restore is the same restored tree with the weights
  reloaded from the checkpoint, which test_sglang_residual.py restores and compares with a
  cold start token for token (and test_sglang_tp2.py at tp=2); what this module adds for every
  pair (a moved store, two restores that must not share a sampling stream) is the image's and
  the driver's, not the provider's;
- the capsule is self-contained: before the second restore the whole store is moved to another
  directory and the capture's workdir deleted. What the image could still need from that
  workdir is its engine's log (the tree's stdout and stderr at dump): the drivers re-point it at
  the restore's workdir (CRIU's --inherit-fd); any other file of it the image references is
  named;
- two restores of one capsule must not share a sampling stream (the product reseeds);
- the n610 capsule of the small model (~254 MB of bf16 weights) leaves the weights out: its
  image is smaller than a dump of the same tree with its weights resident;
- an n580 restore from a native payload verifies the payload once: the provider's stage checks
  every block of every pack right before the engine is built, the launcher tells the engine so
  (COLDSNAP_ARTIFACT_PREVERIFIED=1, from that stage's own `preverified`), and the plugin's
  start-up hydration reads the packs without checking them again (the first restore of the
  n580-native capsule).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from attrs import frozen

from coldsnap import Machine
from coldsnap._wire import status_path
from coldsnap.backends._images import read_file_paths
from coldsnap.backends._stdio import read_stdio_paths
from coldsnap.machine import ModelRef, Receipt

from .conftest import (
    CliCapsule,
    answers,
    capture_request,
    leftovers,
    model_ref,
    restore_request,
    sampled,
    stop_at_once,
    watch,
    why,
)

pytestmark = [
    pytest.mark.criu,
    pytest.mark.sglang,
    pytest.mark.slow,
    pytest.mark.xdist_group("host"),
]
VARIANTS = [("n610", "native"), ("n580", "native"), ("n580", "recovery")]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("e2e")
    yield path
    shutil.rmtree(path, ignore_errors=True)  # capsules are GBs: do not leave them to pytest


@pytest.fixture(scope="module")
def tiny(tiny_llama: Path) -> Path:
    return tiny_llama  # conftest's: built once for the session


@pytest.fixture(scope="module")
def cold(tiny_cold: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """A plain SGLang (no plugin loaded: SGLANG_PLUGINS names none) started from nothing
    (conftest's `tiny_cold`, shared with the command line's end-to-end test)."""
    return tiny_cold


@frozen
class Restored:
    """What one restore of a capsule answered, and what it left running once stopped."""

    answers: list[tuple[int, ...]]
    acceptance_tokens: list[int]
    sampled: tuple[int, ...]
    left_running: list[str]
    not_portable: list[str]  # what ties a moved capsule to its old store or capture workdir
    stage: dict[str, Any] | None  # n580 native: the stage's step and the start-up hydration


@frozen
class Variant:
    """One capture of a driver/provider pair and two restores of its capsule, the second after
    the first was stopped. Everything it started is stopped before the fixture returns."""

    name: str
    acceptance_tokens: list[int]
    source_left_running: list[str]
    restores: tuple[Restored, ...]


@pytest.fixture(scope="module", params=VARIANTS, ids=[f"{d}-{p}" for d, p in VARIANTS])
def variant(request: pytest.FixtureRequest, root: Path, tiny: Path) -> Variant:
    driver, provider = request.param
    name = f"{driver}-{provider}"
    base = root / name
    base.mkdir()
    model = model_ref(tiny)
    tag, old_stores = name, [base / "store"]
    try:
        if (driver, provider) == ("n610", "native"):  # the command line's capture, the same
            capsule: CliCapsule = request.getfixturevalue("cli_capsule")
            receipt, tag = capsule.receipt, "tiny"
            model = ModelRef(**capsule.request["model"])  # type: ignore[arg-type]
            capsule.own_store(base)
            old_stores.append(capsule.store)
        else:
            capture = capture_request(base, model, driver, provider, name)
            receipt = Machine.for_request(capture).capture(capture)
        assert receipt.ok, why(receipt)
        dirs, pids = watch(receipt)
        source_left = leftovers(dirs, pids)
        restores = []
        store, workdir = base / "store", Path(receipt.workdir).resolve()
        for attempt in range(2):
            not_portable: list[str] = []
            if attempt == 1:  # the capsule alone: the store moved, the capture workdir gone
                store = root / f"elsewhere-{name}" / "store"
                store.parent.mkdir()
                os.rename(base / "store", store)
                shutil.rmtree(workdir, ignore_errors=True)  # the command line's: gone already
                not_portable += _links_out_of(store)
                for old in old_stores:
                    not_portable += [f"{p} names {old}" for p in _naming(store, old)]
            restore = attrs.evolve(
                restore_request(base, model, driver, provider, name, f"res-{attempt}"),
                store=str(store),
                artifact=tag,
            )
            machine = Machine.for_request(restore)
            restored = machine.restore(restore)
            assert restored.ok, why(restored)
            more_dirs, more_pids = watch(restored)
            dirs, pids = dirs | more_dirs, pids | more_pids
            try:
                url = restored.facts["engine_url"]
                got, draw = answers(url), sampled(url)
                stage = _stage(restored) if (driver, provider) == ("n580", "native") else None
                if attempt == 1:
                    not_portable += _needs_from(Path(restored.facts["image_dir"]), workdir)
                    if not (Path(restore.workdir) / "engine.log").stat().st_size:
                        not_portable.append("the restored engine writes nothing to its log")
            # The first restore's stop is the graceful one, except n580 recovery's (n580's
            # graceful stop is checked on its native capsule); the second's is not checked.
            finally:
                if attempt == 1 or name == "n580-recovery":
                    stop_at_once(machine, restored)
                else:
                    machine.stop(restored)
            if attempt == 1 and workdir.exists():
                not_portable.append("the restored engine wrote into the old capture workdir")
            restores.append(
                Restored(
                    got,
                    restored.facts["acceptance_tokens"],
                    draw,
                    leftovers(dirs, pids),
                    not_portable,
                    stage,
                )
            )
        return Variant(name, receipt.facts["acceptance_tokens"], source_left, tuple(restores))
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(root / f"elsewhere-{name}", ignore_errors=True)


def _stage(restored: Receipt) -> dict[str, Any]:
    """How an n580 native restore verified its payload: the stage's step status, whether it
    said how long its check took, and the scheduler's start-up hydration record."""
    record = json.loads(
        status_path(Path(restored.facts["runtime_dir"]), "scheduler-tp0").read_text()
    )
    return {
        "stage_payload": {step.name: step.status for step in restored.steps}["stage_payload"],
        "timed": "verify_seconds" in restored.facts,
        "hydration": record["startup_hydration"]["target"],
    }


def _links_out_of(store: Path) -> list[str]:
    """Symbolic links in the store that point outside it (or by an absolute path)."""
    found = []
    for path in store.rglob("*"):
        if path.is_symlink():
            target = os.readlink(path)
            resolved = (path.parent / target).resolve()
            if os.path.isabs(target) or not resolved.is_relative_to(store.resolve()):
                found.append(f"{path} -> {target}")
    return found


def _naming(store: Path, old: Path) -> list[Path]:
    """Files of the store (up to 1 MB: records, manifests, tags) that name the old store."""
    needle = str(old).encode()
    return [
        p
        for p in store.rglob("*")
        if p.is_file() and p.stat().st_size < 1 << 20 and needle in p.read_bytes()
    ]


def _needs_from(images: Path, workdir: Path) -> list[str]:
    """Files of the capture's workdir the laid-out image references, beyond its stdout and
    stderr (the engine's log, which the drivers re-point at restore)."""
    if not (images / "files.img").is_file():
        return [f"no image laid out at {images}"]
    stdio = read_stdio_paths(images)
    problems = [f"stdout/stderr {p} is not the capture's log" for p in stdio
                if Path(p).parent != workdir]  # fmt: skip
    outside = {p for p in read_file_paths(images) if Path(p).is_relative_to(workdir)}
    problems += [f"the image needs {p}" for p in sorted(outside - set(stdio))]
    return problems


def test_one_capsule_restores_twice_and_answers_like_a_cold_start(
    variant: Variant, cold: list[tuple[int, ...]]
) -> None:
    assert not variant.source_left_running, "the capture's source was not retired"
    for attempt, restored in enumerate(variant.restores):
        assert restored.answers == cold, f"restore {attempt}"
        assert restored.acceptance_tokens == variant.acceptance_tokens, f"restore {attempt}"
        assert not restored.left_running, f"restore {attempt} left processes running"


def test_a_moved_store_restores_without_the_capture_workdir(variant: Variant) -> None:
    """The second restore ran from the store moved elsewhere, the capture's workdir deleted;
    its answers are checked with the others above."""
    assert not variant.restores[0].not_portable
    assert not variant.restores[1].not_portable, "; ".join(variant.restores[1].not_portable)


def test_replicas_of_one_capsule_do_not_share_a_sampling_stream(variant: Variant) -> None:
    """Every restore of an image starts from the same RNG state (docs/criu.md); unless
    the product reseeds, two replicas sample the same tokens for the same unseeded request."""
    first, second = (restored.sampled for restored in variant.restores)
    assert first != second, (
        f"{variant.name}: both restores sampled {list(first)} at temperature 1: "
        "the restored replicas share one random stream (not reseeded after restore)"
    )


def test_an_n580_native_restore_verifies_its_payload_once(variant: Variant) -> None:
    """The n580-native capsule's first restore: the stage checked every block and said how
    long it took; the engine was built from the payload and did not check it again."""
    if variant.name != "n580-native":
        pytest.skip("only an n580 restore from a native payload builds its engine from packs")
    stage = variant.restores[0].stage
    assert stage is not None
    assert stage["stage_payload"] == "done" and stage["timed"]  # the stage checked every block
    assert stage["hydration"]["nbytes"] > 0  # the engine was built from the payload...
    assert stage["hydration"]["verify_seconds"] == 0.0  # ...and did not check it again


def test_the_n610_capsule_of_the_small_model_leaves_the_weights_out(
    e2e_ready: None, root: Path
) -> None:
    """The capsule's image against a dump of the same tree with weights and KV cache back."""
    from coldsnap._wire import KV_CACHE, WEIGHTS, ResumePlan, write_plan
    from coldsnap.backends import Criu
    from coldsnap.engines import EngineClient
    from coldsnap.engines.sglang import SGLANG_POLICY
    from coldsnap.tiny_models import build_model

    info = build_model(root / "small-llama", arch="llama", size="small", seed=0)
    base = root / "small"
    base.mkdir()
    request = capture_request(
        base, model_ref(info.path, "small-llama"), "n610", "recovery", "small", keep_source=True
    )
    machine = Machine.for_request(request)
    receipt = machine.capture(request)
    assert receipt.ok, why(receipt)
    pid = receipt.facts["engine_pid"]
    dirs, pids = watch(receipt)
    try:
        # The kept source has released its weights and KV cache: resume both (the weights
        # from the checkpoint) to get the tree as it was before the release steps.
        write_plan(
            Path(receipt.facts["runtime_dir"]),
            ResumePlan(source="checkpoint", checkpoint=str(info.path)),
        )
        with EngineClient(receipt.facts["engine_url"], SGLANG_POLICY) as client:
            client.resume([WEIGHTS, KV_CACHE])
            assert client.acceptance_tokens() == tuple(receipt.facts["acceptance_tokens"])
        baseline = Criu().dump(pid, base / "baseline-image", leave_running=False)
    finally:
        machine.stop(receipt)
    assert not leftovers(dirs, pids)
    capsule_image = receipt.facts["image_bytes"]
    saved = baseline.image_bytes - capsule_image
    print(
        f"\nsmall model: weights {info.weight_bytes / 1e6:.1f} MB, capsule image "
        f"{capsule_image / 1e6:.1f} MB, whole-tree image {baseline.image_bytes / 1e6:.1f} MB, "
        f"left out {saved / 1e6:.1f} MB ({saved / info.weight_bytes:.0%} of the weights)"
    )
    shutil.rmtree(base, ignore_errors=True)
    assert saved >= 0.9 * info.weight_bytes, (baseline.image_bytes, capsule_image, info)
