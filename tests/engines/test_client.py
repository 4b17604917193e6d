"""The engine-neutral HTTP client against httpx.MockTransport (no network, no server)."""

from __future__ import annotations

import json
from collections.abc import Callable

import attrs
import httpx
import pytest

from coldsnap.engines import (
    AcceptanceError,
    EngineClient,
    EngineError,
    RetryPolicy,
)
from coldsnap.engines.sglang import SGLANG_POLICY

Handler = Callable[[httpx.Request], httpx.Response]


class Recorder:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.handler(request)

    def bodies(self) -> list[object]:
        return [json.loads(r.content) if r.content else None for r in self.requests]


def client(handler: Handler, policy=SGLANG_POLICY) -> tuple[EngineClient, Recorder]:
    rec = Recorder(handler)
    sleeps: list[float] = []
    c = EngineClient(
        "http://engine", policy, transport=httpx.MockTransport(rec), sleep=sleeps.append
    )
    return c, rec


def test_generate_is_greedy_and_parses_token_ids() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        assert req.url.path == "/generate"
        return httpx.Response(
            200, json={"text": "ab", "output_ids": [5, 6, 7], "meta_info": {"id": "x"}}
        )

    c, rec = client(handler)
    out = c.generate("hello", max_new_tokens=3)
    assert out.token_ids == (5, 6, 7)
    assert out.meta == {"id": "x"}
    assert rec.bodies() == [
        {"text": "hello", "sampling_params": {"temperature": 0.0, "max_new_tokens": 3}}
    ]


def test_generate_accepts_token_ids_as_prompt() -> None:
    c, rec = client(lambda r: httpx.Response(200, json={"output_ids": [1]}))
    c.generate([3, 4], max_new_tokens=1)
    assert rec.bodies()[0]["input_ids"] == [3, 4]


def _answers(output_ids: list[int]) -> Handler:
    """An engine whose prefix cache flushes at once and whose every answer is `output_ids`."""

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == SGLANG_POLICY.endpoints.flush_cache:
            return httpx.Response(200, text="Cache flushed.")
        return httpx.Response(200, json={"output_ids": output_ids})

    return handler


def test_acceptance_passes_on_equal_tokens_and_names_first_difference() -> None:
    c, rec = client(_answers([1, 2, 3, 9]))
    assert c.accept([1, 2, 3, 9]) == (1, 2, 3, 9)
    body = rec.bodies()[1]
    assert body["text"] == SGLANG_POLICY.acceptance.prompt
    assert body["sampling_params"]["max_new_tokens"] == SGLANG_POLICY.acceptance.max_new_tokens
    with pytest.raises(AcceptanceError) as info:
        c.accept([1, 2, 4, 9])
    assert info.value.first_difference == 2
    assert "position 2" in str(info.value)
    with pytest.raises(AcceptanceError) as info:
        c.accept([1, 2, 3])
    assert info.value.first_difference == 3


def test_acceptance_runs_from_an_empty_prefix_cache_waiting_out_a_busy_engine() -> None:
    """Recorded at capture and compared at restore, the acceptance answer must come from the
    same (empty) cache: a flush first, asked again while the engine is busy (HTTP 400)."""
    refusals = [2]

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == SGLANG_POLICY.endpoints.flush_cache:
            if refusals[0]:
                refusals[0] -= 1
                return httpx.Response(400, text="Cache not flushed: requests are running")
            return httpx.Response(200, text="Cache flushed.")
        return httpx.Response(200, json={"output_ids": [4, 5]})

    c, rec = client(handler)
    assert c.acceptance_tokens() == (4, 5)
    paths = [r.url.path for r in rec.requests]
    flush = SGLANG_POLICY.endpoints.flush_cache
    assert paths == [flush, flush, flush, SGLANG_POLICY.endpoints.generate]


def test_acceptance_is_not_asked_when_the_cache_cannot_be_flushed() -> None:
    policy = attrs.evolve(
        SGLANG_POLICY, timeouts=attrs.evolve(SGLANG_POLICY.timeouts, flush_cache=0.0)
    )

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == SGLANG_POLICY.endpoints.flush_cache:
            return httpx.Response(400, text="Cache not flushed: requests are running")
        raise AssertionError("generate must not be asked")

    c, _ = client(handler, policy)
    with pytest.raises(EngineError, match="flush_cache"):
        c.acceptance_tokens()


def test_health_maps_200_and_503_and_raises_on_others() -> None:
    codes = iter([200, 503, 500])
    c, _ = client(lambda r: httpx.Response(next(codes)))
    assert c.health() is True
    assert c.health() is False
    with pytest.raises(EngineError) as info:
        c.health()
    assert info.value.status == 500 and info.value.operation == "health"


def test_release_and_resume_send_tags_and_refuse_unknown_tags() -> None:
    c, rec = client(lambda r: httpx.Response(200))
    c.release(["weights"])
    c.resume()
    assert [r.url.path for r in rec.requests] == [
        "/release_memory_occupation",
        "/resume_memory_occupation",
    ]
    assert rec.bodies() == [{"tags": ["weights"]}, {"tags": None}]
    with pytest.raises(ValueError, match="unknown memory tag"):
        c.release(["weights", "vram"])
    assert len(rec.requests) == 2  # refused before any request


def test_engine_error_carries_the_engines_message() -> None:
    msg = {"error": {"message": "coldsnap resume did not complete: no resume plan"}}
    c, _ = client(lambda r: httpx.Response(400, json=msg))
    with pytest.raises(EngineError) as info:
        c.resume()
    assert info.value.status == 400
    assert "no resume plan" in str(info.value)


def test_update_weights_from_disk_checks_success() -> None:
    answers = iter([
        httpx.Response(200, json={"success": True, "message": "ok", "num_paused_requests": 0}),
        httpx.Response(400, json={"success": False, "message": "Failed to get weights iterator"}),
    ])  # fmt: skip
    c, rec = client(lambda r: next(answers))
    assert c.update_weights_from_disk("/ckpt", load_format="safetensors")["success"] is True
    assert rec.bodies()[0] == {
        "flush_cache": True,
        "model_path": "/ckpt",
        "load_format": "safetensors",
    }
    with pytest.raises(EngineError, match="weights iterator"):
        c.update_weights_from_disk("/bad")


def test_idempotent_calls_retry_transient_failures_within_bounds() -> None:
    calls = {"n": 0}

    def flaky(req: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] < 3:
            raise httpx.ConnectError("refused", request=req)
        return httpx.Response(200, json={"model_path": "/m"})

    c, _ = client(flaky)
    assert c.server_info() == {"model_path": "/m"}
    assert calls["n"] == 3


def test_retries_are_bounded() -> None:
    policy = attrs.evolve(SGLANG_POLICY, retry=RetryPolicy(attempts=2))
    calls = {"n": 0}

    def down(req: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        raise httpx.ConnectError("refused", request=req)

    c, _ = client(down, policy)
    with pytest.raises(EngineError, match="ConnectError"):
        c.server_info()
    assert calls["n"] == 2


def test_non_idempotent_calls_are_not_retried_after_reaching_the_engine() -> None:
    calls = {"n": 0}

    def slow(req: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        raise httpx.ReadTimeout("slow", request=req)

    c, _ = client(slow)
    with pytest.raises(EngineError, match="ReadTimeout"):
        c.resume(["weights"])
    assert calls["n"] == 1  # a second resume could change state twice


def test_idempotent_503_is_retried_then_reported() -> None:
    calls = {"n": 0}

    def busy(req: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        return httpx.Response(503, text="busy")

    c, _ = client(busy)
    with pytest.raises(EngineError) as info:
        c.flush_cache()
    assert info.value.status == 503
    assert calls["n"] == SGLANG_POLICY.retry.attempts


def test_wait_healthy_polls_until_200_and_times_out() -> None:
    codes = iter([503, 503, 200])
    c, rec = client(lambda r: httpx.Response(next(codes)))
    c.wait_healthy(30, interval=0)
    assert len(rec.requests) == 3
    c2, _ = client(lambda r: httpx.Response(503))
    with pytest.raises(EngineError, match="not healthy after 0 s"):
        c2.wait_healthy(0, interval=0)


def test_wait_healthy_honours_a_step_check() -> None:
    class Stop(Exception):
        pass

    def check() -> None:
        raise Stop

    c, rec = client(lambda r: httpx.Response(503))
    with pytest.raises(Stop):
        c.wait_healthy(30, check=check)
    assert rec.requests == []


def test_generate_rejects_an_answer_without_token_ids() -> None:
    c, _ = client(lambda r: httpx.Response(200, json={"text": "x"}))
    with pytest.raises(EngineError, match="output_ids"):
        c.generate("p", max_new_tokens=1)


def test_policy_is_data_a_second_engine_needs_no_client_change() -> None:
    from coldsnap.engines import Endpoints, GenerateDialect

    other = attrs.evolve(
        SGLANG_POLICY,
        name="other",
        endpoints=Endpoints(generate="/v2/gen", health="/healthz"),
        dialect=GenerateDialect(
            text_field="prompt",
            sampling_field="params",
            max_tokens_key="max_tokens",
            output_ids_field="tokens",
        ),
    )

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/healthz":
            return httpx.Response(200)
        assert req.url.path == "/v2/gen"
        return httpx.Response(200, json={"tokens": [4]})

    c, rec = client(handler, other)
    assert c.health()
    assert c.generate("p", max_new_tokens=2).token_ids == (4,)
    assert rec.bodies()[1] == {"prompt": "p", "params": {"temperature": 0.0, "max_tokens": 2}}


def test_clients_share_one_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """A restore makes a client per engine step; building each its own TLS context (the CA
    bundle loaded again) cost about 40 ms a step."""
    from coldsnap.engines import _client

    built: list[object] = []
    real = httpx.create_ssl_context

    def counting(*args: object, **kwargs: object) -> object:
        built.append(1)
        return real()

    monkeypatch.setattr(_client.httpx, "create_ssl_context", counting)
    _client._tls.cache_clear()
    try:
        for _ in range(3):
            EngineClient("https://engine", SGLANG_POLICY).close()
        assert len(built) == 1
    finally:
        _client._tls.cache_clear()


def test_a_probe_asked_once_is_not_retried() -> None:
    """wait_healthy polls every 20 ms itself: a retry's back-off would see a server that just
    came up up to 0.8 s late."""
    calls = {"n": 0}

    def down(req: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        raise httpx.ConnectError("refused", request=req)

    c, _ = client(down)
    for probe in (c.ready, c.ping, c.health):
        with pytest.raises(EngineError, match="ConnectError"):
            probe(once=True)
    assert calls["n"] == 3
