"""The SGLang policy against a real SGLang server on CPU (plugin installed but inert)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coldsnap._wire import KV_CACHE
from coldsnap.engines import AcceptanceError, EngineClient, EngineError
from coldsnap.engines.sglang import SGLANG_POLICY

pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.xdist_group("host")]


@pytest.fixture(scope="module")
def engine(sglang_cpu: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from coldsnap.backends.procs import kill_tree
    from coldsnap.testing.sglang_cpu import start_server
    from coldsnap.tiny_models import build_model

    root = tmp_path_factory.mktemp("engine")
    first = build_model(root / "a", arch="llama", size="tiny", seed=0)
    second = build_model(root / "b", arch="llama", size="tiny", seed=7)
    log = root / "server.log"
    with (
        start_server(first.path, log_path=log, env={"COLDSNAP_MODE": "off"}) as server,
        EngineClient(server.url, SGLANG_POLICY) as client,
    ):
        yield {"client": client, "first": first, "second": second}
        if server.process.poll() is None:  # at once: its graceful drain is not checked here
            kill_tree(server.process.pid)


def test_health_ready_and_info(engine: dict[str, Any]) -> None:
    c = engine["client"]
    # A healthy server answers the first poll (SGLang's /health takes about a second).
    assert c.wait_healthy(30) < 10.0
    assert c.health() is True and c.ready() is True
    assert c.server_info()["model_path"] == str(engine["first"].path)
    assert c.model_info()["weight_version"] == "default"


def test_greedy_generation_is_repeatable_and_acceptance_compares_ids(
    engine: dict[str, Any],
) -> None:
    c = engine["client"]
    acceptance = SGLANG_POLICY.acceptance
    tokens = c.acceptance_tokens()
    assert len(tokens) == acceptance.max_new_tokens
    # Greedy decoding answers the same ids each time.
    again = c.generate(acceptance.prompt, max_new_tokens=acceptance.max_new_tokens)
    assert again.token_ids == tokens
    c.accept(tokens)  # raises AcceptanceError unless the ids are the recorded ones
    with pytest.raises(AcceptanceError) as info:
        c.accept((tokens[0] + 1, *tokens[1:]))
    assert info.value.first_difference == 0
    with pytest.raises(AcceptanceError) as info:
        c.accept((*tokens[:-1], tokens[-1] + 1))
    assert info.value.first_difference == len(tokens) - 1
    by_ids = c.generate([5, 6, 7], max_new_tokens=4)
    assert len(by_ids.token_ids) == 4
    assert c.generate([5, 6, 7], max_new_tokens=4).token_ids == by_ids.token_ids


def test_update_weights_from_disk_switches_weight_sets_and_back(engine: dict[str, Any]) -> None:
    c = engine["client"]
    before = c.acceptance_tokens()
    checksum = c.weights_checksum()["per_engine_checksum"]
    out = c.update_weights_from_disk(str(engine["second"].path), weight_version="b")
    assert out["success"] is True
    assert c.model_info()["weight_version"] == "b"
    assert c.weights_checksum()["per_engine_checksum"] != checksum
    c.update_weights_from_disk(str(engine["first"].path), weight_version="a")
    assert c.weights_checksum()["per_engine_checksum"] == checksum
    c.accept(before)  # raises AcceptanceError unless the ids are those of the first weights


def test_update_from_a_missing_path_is_an_engine_error(
    engine: dict[str, Any], tmp_path: Path
) -> None:
    with pytest.raises(EngineError) as info:
        engine["client"].update_weights_from_disk(str(tmp_path / "nothing-here"))
    assert info.value.operation == "update_weights_from_disk"
    assert engine["client"].health() is True


def test_flush_release_resume_without_the_plugin(engine: dict[str, Any]) -> None:
    c = engine["client"]
    before = c.acceptance_tokens()
    c.flush_cache()
    c.release([KV_CACHE])
    c.resume([KV_CACHE])
    c.accept(before)  # raises AcceptanceError unless the ids are those before the release
