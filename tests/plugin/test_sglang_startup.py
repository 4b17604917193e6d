"""A bad COLDSNAP_* value stops a real SGLang start-up with a message naming the variable."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests._support import missing

from .conftest import plugin_env

pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.xdist_group("host")]


@pytest.mark.parametrize("release", ["0.5.23", "0.5.17"])
def test_bad_setting_stops_startup_with_the_message(
    sglang_cpu: None, models_root: Path, tmp_path: Path, release: str
) -> None:
    from coldsnap.testing.sglang_cpu import (
        ReleaseNotInstalled,
        ServerStartError,
        release_overlay,
        start_server,
    )
    from coldsnap.tiny_models import build_model

    try:
        release_overlay(release)
    except ReleaseNotInstalled as exc:
        missing("sglang", str(exc))
    model = build_model(models_root / "llama-tiny", arch="llama", size="tiny", seed=0)
    env = plugin_env(
        tmp_path / "run", COLDSNAP_LIVE_BACKING="gpu-vmm", COLDSNAP_SHAPE_CALIBRATION="x"
    )
    t0 = time.monotonic()
    with pytest.raises(ServerStartError) as info:
        start_server(
            model.path, log_path=tmp_path / "server.log", env=env, timeout=120, release=release
        )
    message = str(info.value)
    assert "exited with code" in message
    accepted = "discard, cpu, disk"
    assert f"COLDSNAP_LIVE_BACKING: 'gpu-vmm' is not one of: {accepted}" in message
    assert "COLDSNAP_SHAPE_CALIBRATION: 'x' is not one of: off, record" in message
    # It stops in the launcher, before any scheduler starts or any port opens.
    assert "Init parallel" not in (tmp_path / "server.log").read_text()
    assert time.monotonic() - t0 < 60
