"""free_port keeps out of the kernel's ephemeral range, where it can."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from coldsnap.engines.sglang import _launcher, free_port


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_a_port_below_the_ephemeral_range(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "range").write_text("32768\t60999\n")
    monkeypatch.setattr(_launcher, "_EPHEMERAL", tmp_path / "range")
    ports = {free_port() for _ in range(20)}
    assert all(20000 <= p < 32768 for p in ports)
    assert all(_bindable(p) for p in ports)


def test_a_range_covering_every_candidate_leaves_it_to_the_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "range").write_text("1024 65535\n")
    monkeypatch.setattr(_launcher, "_EPHEMERAL", tmp_path / "range")
    assert _bindable(free_port())
