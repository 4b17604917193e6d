"""The architecture matrix's CPU share: each architecture that SGLang serves on CPU, captured by
n610 native through `Machine` and restored, answers token for token like a cold start.

Cheap by design, one server start per architecture: the capture's own engine, started from
nothing by the capture's launch command, is the cold start. Right after it is healthy, and
before the capture records its acceptance answer or releases anything, a subscriber asks it
every prompt (the prefix cache flushed before each, and after the last): those are the cold
answers. The capsule is then restored once, asked the same prompts the same way, and stopped.
Each architecture has a directory of its own (model, store, workdirs), removed once it is done.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from attrs import frozen

from coldsnap import Machine
from coldsnap.engines import EngineClient
from coldsnap.engines.sglang import SGLANG_POLICY
from coldsnap.machine import JOURNAL_NAME, Replay, StepEvent, read_journal

from .conftest import (
    MAX_NEW_TOKENS,
    PROMPTS,
    capture_request,
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

# (coldsnap.tiny_models arch, tied): None is the architecture's own choice (Qwen2 and Qwen3
# tie). Gemma 2, Mistral and Llama with Llama 3's rope scaling also serve on CPU (SGLang serves
# the last two with its Llama model) and are left to the GPU matrix to keep `make test` within
# its time (each architecture here is a server start, about 35 s on two cores); Qwen2-MoE
# does not serve on CPU: SGLang's shared-expert gate runs a Triton kernel at the first forward.
ARCHS = {  # untied Llama, n610 native: tests/e2e/test_sglang_e2e.py, the same capture and restore
    "llama-tied": ("llama", True),
    "qwen2": ("qwen2", None),
    "qwen3": ("qwen3", None),
    "phi3": ("phi3", None),
}


def flushed_answers(url: str) -> list[tuple[int, ...]]:
    """Greedy answers to PROMPTS, the prefix cache flushed before each and after the last, so
    that no answer comes from a cache the other side did not have."""
    with EngineClient(url, SGLANG_POLICY) as client:
        out = []
        for prompt in PROMPTS:
            client.flush_cache()
            out.append(client.generate(prompt, max_new_tokens=MAX_NEW_TOKENS).token_ids)
        client.flush_cache()
        return out


def ask_when_healthy(workdir: Path, into: list[object]) -> Callable[[StepEvent], None]:
    """A subscriber that, once the capture's engine is healthy, puts its answers (or what
    failed) in `into`: it runs in the machine's thread, before the next step."""

    def on_event(event: StepEvent) -> None:
        if (event.step, event.phase) != ("wait_healthy", "done"):
            return
        try:
            facts = Replay.of(read_journal(workdir / JOURNAL_NAME)).facts
            into.append(flushed_answers(facts["engine_url"]))
        except Exception as exc:  # kept and raised by the fixture, not swallowed
            into.append(exc)

    return on_event


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
        assert len(cold) == 1, "the subscriber never saw the engine healthy"
        if isinstance(cold[0], Exception):
            raise cold[0]
        restore = restore_request(base, model, "n610", "native", name, "restore")
        machine = Machine.for_request(restore)
        restored = machine.restore(restore)
        assert restored.ok, why(restored)
        try:
            answers = flushed_answers(restored.facts["engine_url"])
        finally:
            stop_at_once(machine, restored)
        yield Matched(cold[0], answers)  # type: ignore[arg-type]
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_restore_answers_like_the_cold_start(matched: Matched) -> None:
    assert len(matched.cold) == len(PROMPTS) and all(matched.cold)
    assert matched.restored == matched.cold
