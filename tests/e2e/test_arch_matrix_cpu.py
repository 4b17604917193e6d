"""The architecture matrix's CPU share: each architecture that SGLang serves on CPU, captured by
n610 native through `Machine` and restored, answers token for token like a cold start.

Cheap by design, one server start per architecture: the capture's own engine, started from
nothing by the capture's launch command, is the cold start. Right after it is healthy, and
before the capture records its acceptance answer or releases anything, a subscriber
(conftest's `ask_when_healthy`) asks it every prompt (the prefix cache flushed before each, and
after the last): those are the cold answers. The capsule is then restored once, asked the same
prompts the same way, and stopped. Each architecture has a directory of its own (model, store,
workdirs), removed once it is done.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from attrs import frozen

from coldsnap import Machine

from .conftest import (
    PROMPTS,
    ask_when_healthy,
    capture_request,
    cold_from,
    flushed_answers,
    model_ref,
    restore_request,
    stop_at_once,
    why,
)

pytestmark = [
    pytest.mark.criu,
    pytest.mark.sglang,
    pytest.mark.slow,
    pytest.mark.xdist_group("host"),
]

# (coldsnap.tiny_models arch, tied): None is the architecture's own choice (Qwen3 ties).
# Qwen2, Gemma 2, Mistral and Llama with Llama 3's rope scaling also serve on CPU (SGLang serves
# the last two with its Llama model) and are left to the GPU matrix to keep `make test` within
# its time (each architecture here is a server start, about 35 s on two cores); SGLang builds
# its Qwen3 on its Qwen2 model and MLP, which the Qwen3 row runs. Qwen2-MoE does not serve on
# CPU: SGLang's shared-expert gate runs a Triton kernel at the first forward.
ARCHS = {  # untied Llama, n610 native: tests/e2e/test_sglang_e2e.py, the same capture and restore
    "llama-tied": ("llama", True),
    "qwen3": ("qwen3", None),
    "phi3": ("phi3", None),
}


@frozen
class Matched:
    cold: list[tuple[int, ...]]
    restored: list[tuple[int, ...]]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("arch-matrix")
    yield path
    shutil.rmtree(path, ignore_errors=True)  # capsules are large: do not leave them to pytest


@pytest.fixture(scope="module", params=list(ARCHS))
def matched(request: pytest.FixtureRequest, e2e_ready: None, root: Path) -> Iterator[Matched]:
    from coldsnap.tiny_models import build_model

    name = request.param
    arch, tied = ARCHS[name]
    base = root / name
    try:
        info = build_model(base / "model", arch, "tiny", 0, tied=tied)
        model = model_ref(info.path, model_id=f"{name}-tiny")
        capture = capture_request(base, model, "n610", "native", name)
        cold: list[object] = []
        machine = Machine.for_request(
            capture, subscribers=[ask_when_healthy(Path(capture.workdir), cold)]
        )
        captured = machine.capture(capture)
        assert captured.ok, why(captured)
        reference = cold_from(cold)
        restore = restore_request(base, model, "n610", "native", name, "restore")
        machine = Machine.for_request(restore)
        restored = machine.restore(restore)
        assert restored.ok, why(restored)
        try:
            answers = flushed_answers(restored.facts["engine_url"])
        finally:
            stop_at_once(machine, restored)
        yield Matched(reference, answers)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_restore_answers_like_the_cold_start(matched: Matched) -> None:
    assert len(matched.cold) == len(PROMPTS) and all(matched.cold)
    assert matched.restored == matched.cold
