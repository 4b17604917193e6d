"""Fixtures of the provider tests (builders live in provider_helpers)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from .provider_helpers import build_model


@pytest.fixture(scope="session")
def make_model() -> Callable[..., torch.nn.Module]:
    return build_model
