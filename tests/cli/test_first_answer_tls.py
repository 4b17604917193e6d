"""The demo's and benchmarks' first answer builds no TLS context per request: httpx makes one
(loading the CA bundle) per top-level call otherwise, 35-70 ms on the 2-core CPU host, which
the restore's timed first answer would include."""

from __future__ import annotations

from typing import Any

import httpx

from coldsnap.cli import _demo


def test_every_first_answer_shares_one_tls_context(monkeypatch: Any) -> None:
    seen: list[Any] = []

    def post(url: str, **kwargs: Any) -> httpx.Response:
        seen.append(kwargs.get("verify"))
        request = httpx.Request("POST", url)
        return httpx.Response(200, json={"output_ids": [1, 2]}, request=request)

    monkeypatch.setattr(_demo.httpx, "post", post)
    assert _demo.first_answer("http://127.0.0.1:1") == (1, 2)
    assert _demo.first_answer("http://127.0.0.1:1") == (1, 2)
    assert seen[0] is not None and seen[0] is not True  # a context, not "build one"
    assert seen[0] is seen[1]
