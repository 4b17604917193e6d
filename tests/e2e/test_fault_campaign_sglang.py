"""The fault campaign with real SGLang (n610, native): one capture and two restores, each
killed once at a step and resumed in a new process, then sleep, wake and stop of a restored
engine, each killed once and resumed; every one ends published-and-serving or rolled back
with nothing left behind (test_fault_campaign.py says what that means, on the toy engine).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from coldsnap.artifacts import Store

from ._faults import Zygote, check_clean, journaled_facts, kill_at

pytestmark = [
    pytest.mark.criu,
    pytest.mark.sglang,
    pytest.mark.slow,
    pytest.mark.xdist_group("host"),
]

PROVIDER = "native"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("faults-sglang", numbered=True)


@pytest.fixture(scope="module")
def sglang_zygote(e2e_ready: None, root: Path) -> Iterator[Zygote]:
    base = root / "sglang"
    base.mkdir()
    warm = Zygote(base, "--sglang")
    yield warm
    warm.close()


@pytest.mark.sglang
@pytest.mark.parametrize(
    ("operation", "step", "outcome"),
    [
        ("capture", "retire_source", "done"),  # retried: published, the source retired
        ("restore", "resume_weights", "rolled_back"),  # the restored engine stopped, no trace
        ("restore", "acceptance", "done"),  # retried: serves, answers as captured, stops clean
    ],
)
def test_real_sglang_killed_and_resumed_ends_clean(
    root: Path,
    sglang_zygote: Zygote,
    tiny_llama: Path,
    operation: str,
    step: str,
    outcome: str,
) -> None:
    from .conftest import answers as sglang_answers
    from .conftest import capture_request as sglang_capture
    from .conftest import model_ref
    from .conftest import restore_request as sglang_restore

    base = root / "sglang"
    model = model_ref(tiny_llama)
    if operation == "capture":
        request = sglang_capture(base, model, "n610", PROVIDER, "real")
    else:
        if "real" not in Store(base / "store").tags():
            pytest.skip("the real capture case did not publish its capsule")
        request = sglang_restore(base, model, "n610", PROVIDER, "real", f"res-{step}")
    workdir = Path(request.workdir)
    seen = kill_at(sglang_zygote, request, step)
    result = sglang_zygote.run("resume", workdir)
    assert result["outcome"] == outcome, result
    facts = journaled_facts(workdir)
    if operation == "capture":
        store = Store(base / "store")
        assert store.tags().get("real") == facts["capsule_digest"]
        store.verify()
    elif outcome == "done":
        try:  # acceptance passed: the greedy answer equals the capture's; the rest answers too
            assert all(sglang_answers(facts["engine_url"]))
        finally:
            sglang_zygote.run("stop", workdir)
    check_clean(sglang_zygote, workdir, facts, seen, files=outcome != "done")


# -- real SGLang: sleep, wake and stop of a restored engine, each killed once and resumed ---------


@pytest.mark.sglang
def test_real_sglang_sleep_wake_and_stop_killed_and_resumed(
    root: Path, sglang_zygote: Zygote, tiny_llama: Path
) -> None:
    """Each lifecycle operation is journaled like a restore: killed at a step, `resume` ends
    it. A sleep killed at its release rolls back (the engine serves again, answering as
    before); a wake killed at its weights' resume rolls back to asleep (health closed); a stop
    killed at its one step is retried and leaves nothing behind."""
    from coldsnap.cli._sleep import operations, sleep_state
    from coldsnap.engines import EngineClient
    from coldsnap.engines.sglang import SGLANG_POLICY
    from coldsnap.machine import lifecycle_request

    from .conftest import answers as sglang_answers
    from .conftest import model_ref
    from .conftest import restore_request as sglang_restore

    base = root / "sglang"
    if "real" not in Store(base / "store").tags():
        pytest.skip("the real capture case did not publish its capsule")
    model = model_ref(tiny_llama)
    request = sglang_restore(base, model, "n610", PROVIDER, "real", "res-lifecycle")
    assert sglang_zygote.request("restore", request).result()["outcome"] == "done"
    target = Path(request.workdir)
    (target / "ops").mkdir()
    facts = journaled_facts(target)
    url = facts["engine_url"]
    expected = sglang_answers(url)

    def killed_then_resumed(operation: str, step: str) -> str:
        op = lifecycle_request(operation, target)
        kill_at(sglang_zygote, op, step)
        return str(sglang_zygote.run("resume", Path(op.workdir))["outcome"])

    def healthy() -> bool:
        with EngineClient(url, SGLANG_POLICY) as client:
            return client.health(once=True)

    try:
        assert killed_then_resumed("sleep", "release") == "rolled_back"
        assert sleep_state(operations(target)) == "awake" and healthy()
        assert sglang_answers(url) == expected, "a rolled-back sleep left the engine changed"

        asleep = lifecycle_request("sleep", target)
        assert sglang_zygote.request("sleep", asleep).result()["outcome"] == "done"
        assert killed_then_resumed("wake", "resume_weights") == "rolled_back"
        assert sleep_state(operations(target)) == "asleep" and not healthy()

        woke = lifecycle_request("wake", target)
        assert sglang_zygote.request("wake", woke).result()["outcome"] == "done"
        assert sleep_state(operations(target)) == "awake"
        assert sglang_answers(url) == expected, "after the wake the engine answers otherwise"

        assert killed_then_resumed("stop", "stop_engine") == "done"
    finally:
        if not any(op.operation == "stop" and op.outcome == "done" for op in operations(target)):
            sglang_zygote.run("stop", target)
    assert not (target / "image").exists() and not (target / "payload").exists()
    check_clean(sglang_zygote, target, facts, set(), files=False)
