"""Fixtures for the engine adapter's tests against a real SGLang on CPU."""

from __future__ import annotations

import importlib.util

import pytest

from tests._support import missing


@pytest.fixture(scope="session")
def sglang_cpu() -> None:
    if importlib.util.find_spec("sglang") is None:
        missing("sglang", "SGLang is not installed (scripts/setup.sh sglang)")
    import torch

    if torch.version.cuda is None:
        from coldsnap.engines.sglang.cpu import activate

        activate()
