"""A capture or restore without root is refused at once, naming root (exit 5: the host lacks
what the operation needs), before any engine starts or any workdir is made."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from coldsnap.artifacts import Store
from coldsnap.cli import main

from .test_operator_errors import LAUNCH, _publish


@pytest.fixture
def not_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("COLDSNAP_SERVING_DIR", str(tmp_path / "serving"))


def test_capture_without_root_says_so_before_launching(not_root: None, tmp_path: Path) -> None:
    (tmp_path / "tiny").mkdir()
    line = [*LAUNCH, "--model-path", str(tmp_path / "tiny")]
    result = CliRunner().invoke(main, ["capture", "--store", str(tmp_path / "store"), "--", *line])
    assert result.exit_code == 5, result.output
    assert "capture needs root (running as uid 1000)" in result.stderr
    assert not (tmp_path / "ops").exists()


def test_restore_without_root_says_so_before_restoring(not_root: None, tmp_path: Path) -> None:
    _publish(Store(tmp_path / "store"), "tiny")
    result = CliRunner().invoke(main, ["restore", "tiny", "--store", str(tmp_path / "store")])
    assert result.exit_code == 5, result.output
    assert "restore needs root (running as uid 1000)" in result.stderr
    assert not (tmp_path / "ops").exists()
