"""An n580 restore from a native payload verifies the payload once, on a real SGLang server.

The provider's stage checks every block of every pack against its checksum right before the
engine is built; the launcher then tells the engine so (COLDSNAP_ARTIFACT_PREVERIFIED=1, from
that stage's own `preverified`), and the plugin's start-up hydration reads the packs without
checking them again. One capture of the tiny Llama (n580, native) and one restore: the stage
spent time verifying, the engine's start-up hydration none, and the restore passed its
acceptance (the capture's greedy answer, token for token).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from coldsnap import Machine
from coldsnap._wire import status_path

from .conftest import (
    capture_request,
    leftovers,
    model_ref,
    restore_request,
    stop_at_once,
    watch,
    why,
)

pytestmark = [
    pytest.mark.criu,
    pytest.mark.sglang,
    pytest.mark.slow,
    pytest.mark.xdist_group("host"),
]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("preverified")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_an_n580_native_restore_verifies_its_payload_once(tiny_llama: Path, root: Path) -> None:
    model = model_ref(tiny_llama)
    capture = capture_request(root, model, "n580", "native", "pv")
    captured = Machine.for_request(capture).capture(capture)
    assert captured.ok, why(captured)
    restore = restore_request(root, model, "n580", "native", "pv", "restore")
    machine = Machine.for_request(restore)
    restored = machine.restore(restore)
    assert restored.ok, why(restored)
    runtime_dirs, pids = watch(restored)
    try:
        steps = {step.name: step.status for step in restored.steps}
        assert steps["stage_payload"] == "done"  # the stage checked every block...
        assert "verify_seconds" in restored.facts  # ...and said how long it took
        record = json.loads(status_path(Path(restored.facts["runtime_dir"]), "scheduler-tp0")
                            .read_text())  # fmt: skip
        hydration = record["startup_hydration"]["target"]
        assert hydration["nbytes"] > 0  # the engine was built from the payload...
        assert hydration["verify_seconds"] == 0.0  # ...and did not check it again
    finally:
        stop_at_once(machine, restored)
    assert leftovers(runtime_dirs, pids) == []
