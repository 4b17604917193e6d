"""The plugin's API key check: a keyed engine requires its runtime directory's key file, never the
key it was started with; without a readable key file it answers no request that needs the key;
its health stays open; an engine started without a key passes through. Checked through SGLang's
own middleware and HookRegistry, and SGLang's shape is a contract: a build whose key decision
differs is refused at admission."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coldsnap._wire import key_path, write_key
from coldsnap.plugin import check
from coldsnap.plugin._auth import AUTH_TARGET, KeyCheck, targets

pytestmark = pytest.mark.usefixtures("sglang_cpu")

THROWAWAY = "throwaway-key-the-image-holds"


@pytest.fixture
def served(tmp_path: Path, clean_hook_registry: Any) -> Iterator[Any]:
    """SGLang's key middleware, started with THROWAWAY, on an app with a generation route and
    a health route, with the key check hooked in as the plugin installs it."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang.srt.utils import auth

    original = auth.decide_request_auth
    for target, kind, hook in targets("main", tmp_path):
        HookRegistry.register(target, hook, getattr(HookType, kind))
    HookRegistry.apply_hooks()
    app = FastAPI()
    app.post("/generate")(lambda: {"text": "ok"})
    app.get("/health")(lambda: {})
    auth.add_api_key_middleware(app, api_key=THROWAWAY, admin_api_key=None)
    try:
        with TestClient(app) as client:
            yield client
    finally:
        auth.decide_request_auth = original


def _status(client: Any, key: str | None, path: str = "/generate") -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    call = client.post if path == "/generate" else client.get
    return int(call(path, headers=headers).status_code)


def test_the_key_file_s_key_is_required_and_the_started_one_refused(
    served: Any, tmp_path: Path
) -> None:
    write_key(tmp_path, "the-operator-key")
    assert _status(served, "the-operator-key") == 200
    for key in (THROWAWAY, None, "the-operator-key-but-longer"):
        assert _status(served, key) == 401
    assert _status(served, None, "/health") == 200


def test_without_a_key_file_nothing_that_needs_the_key_passes(served: Any, tmp_path: Path) -> None:
    assert not key_path(tmp_path).exists()
    assert _status(served, THROWAWAY) == 401
    assert _status(served, None) == 401
    assert _status(served, None, "/health") == 200


def test_an_unreadable_key_file_refuses_like_none(served: Any, tmp_path: Path) -> None:
    key_path(tmp_path).write_text("the-operator-key\n")  # not a key record
    assert _status(served, "the-operator-key") == 401
    assert _status(served, THROWAWAY) == 401


def test_the_key_is_read_on_each_request(served: Any, tmp_path: Path) -> None:
    write_key(tmp_path, "first")
    assert _status(served, "first") == 200
    write_key(tmp_path, "second")
    assert (_status(served, "first"), _status(served, "second")) == (401, 200)


def test_an_engine_started_without_a_key_passes_through(tmp_path: Path) -> None:
    write_key(tmp_path, "unused")
    seen: list[dict[str, Any]] = []

    def decide(**kwargs: Any) -> str:
        seen.append(kwargs)
        return "decision"

    given = {"api_key": None, "authorization_header": None, "path": "/generate"}
    assert KeyCheck(tmp_path).around_decide(decide, **given) == "decision"
    assert seen == [given]


def test_only_the_http_process_checks_keys(tmp_path: Path) -> None:
    assert [t for t, _k, _h in targets("main", tmp_path)] == [AUTH_TARGET]
    assert targets("scheduler", tmp_path) == []


def test_an_sglang_whose_key_decision_differs_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.utils import auth

    def decide_request_auth(*, method: str, path: str, headers: Any, key: Any) -> Any: ...

    monkeypatch.setattr(auth, "decide_request_auth", decide_request_auth)
    problems, _ = check()
    assert [g for g, _ in problems] == ["api key"]
    assert "decide_request_auth takes (method, path, headers, key)" in problems[0][1]


def test_a_middleware_that_stops_asking_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.utils import auth

    def add_api_key_middleware(app: Any, *, api_key: Any, admin_api_key: Any) -> None:
        """Checks keys by itself."""

    monkeypatch.setattr(auth, "add_api_key_middleware", add_api_key_middleware)
    problems, _ = check()
    assert [g for g, _ in problems] == ["api key"]
    assert "no longer contains" in problems[0][1]
