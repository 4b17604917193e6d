"""What the keyed-server tests (test_api_key_e2e.py: n610; test_n580_manage_e2e.py: n580) ask
of a restored engine and of the files an operation left: a request's HTTP status with a given
key, and which files hold a key."""

from __future__ import annotations

from pathlib import Path

import httpx


def files_holding(root: Path, needle: bytes) -> list[str]:
    """Files under `root` whose bytes contain `needle`."""
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def status_code(url: str, path: str, key: str | None) -> int:
    """The HTTP status of one request to `path` with `key` as its bearer token (None: none);
    /generate is asked for two greedy tokens."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    if path == "/generate":
        body = {"text": "hello", "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
        return httpx.post(url + path, json=body, headers=headers, timeout=60).status_code
    return httpx.get(url + path, headers=headers, timeout=60).status_code
