"""Admission: the plugin checks the installed SGLang's contracts by structure and fails closed
(with SystemExit, since SGLang only logs plugin exceptions) naming the contract."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import coldsnap.plugin as plugin
from coldsnap.plugin import CONTRACTS, GROUPS, ContractError, admit, check, hook_landed
from tests._support import missing

pytestmark = pytest.mark.usefixtures("sglang_cpu")

WU = "sglang.srt.managers.scheduler_components.weight_updater"
RWU = "sglang.srt.model_executor.model_runner_components.weight_updater"


def test_installed_sglang_meets_every_contract() -> None:
    problems, digest = check()
    assert problems == []
    assert digest.startswith("sha256:") and len(digest) == 71
    assert check()[1] == digest  # stable: no addresses or times in it


def test_every_contract_family_of_the_issue_is_checked() -> None:
    assert {
        "entry-point group", "hook registry", "memory saver", "loader", "weight updater",
        "speculative worker", "tokenizer manager",
    } <= set(GROUPS)  # fmt: skip
    assert len(CONTRACTS) > 30


def test_missing_method_fails_closed_naming_the_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    mod = importlib.import_module(WU)
    monkeypatch.delattr(mod.SchedulerWeightUpdaterManager, "resume_memory_occupation")
    with pytest.raises(ContractError) as info:
        admit()
    assert info.value.contracts == ("weight updater",)
    assert "SGLang contract 'weight updater' not met" in str(info.value)
    assert "SchedulerWeightUpdaterManager.resume_memory_occupation does not exist" in str(
        info.value
    )


def test_changed_signature_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    mod = importlib.import_module(RWU)

    def update_weights_from_disk(self: Any, path: str) -> None: ...

    monkeypatch.setattr(mod.WeightUpdater, "update_weights_from_disk", update_weights_from_disk)
    problems, _ = check()
    assert len(problems) == 1
    group, message = problems[0]
    assert group == "weight updater"
    assert (
        "takes (self, path), expected leading parameters (self, model_path, load_format" in message
    )


def test_changed_tag_value_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    import sglang.srt.constants as constants

    monkeypatch.setattr(constants, "GPU_MEMORY_TYPE_WEIGHTS", "params")
    problems, _ = check()
    assert (
        "memory saver",
        "sglang.srt.constants.GPU_MEMORY_TYPE_WEIGHTS is 'params', expected 'weights'",
    ) in problems


def test_changed_behaviour_is_reported_and_changes_the_digest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib

    mod = importlib.import_module(WU)
    _, before = check()

    def release_memory_occupation(self: Any, recv_req: Any) -> None:
        """Frees nothing."""

    monkeypatch.setattr(
        mod.SchedulerWeightUpdaterManager, "release_memory_occupation", release_memory_occupation
    )
    problems, after = check()
    assert after != before
    assert [g for g, _ in problems] == ["weight updater"]
    assert "no longer contains" in problems[0][1]


def test_missing_module_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    import sglang.srt.speculative.base_spec_worker as spec

    monkeypatch.delattr(spec, "BaseSpecWorker")
    problems, _ = check()
    assert [g for g, _ in problems] == ["speculative worker"]


def test_register_exits_naming_the_contract_and_registers_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, clean_hook_registry: Any
) -> None:
    import importlib

    mod = importlib.import_module(WU)
    monkeypatch.delattr(mod.SchedulerWeightUpdaterManager, "release_memory_occupation")
    monkeypatch.setenv("COLDSNAP_MODE", "capture")
    monkeypatch.setenv("COLDSNAP_RUNTIME_DIR", str(tmp_path))
    before = {k: len(v) for k, v in clean_hook_registry._hooks.items()}
    with pytest.raises(SystemExit) as info:
        plugin.register()
    assert "SGLang contract 'weight updater' not met" in str(info.value.code)
    assert {k: len(v) for k, v in clean_hook_registry._hooks.items() if v} == {
        k: n for k, n in before.items() if n
    }


def test_register_exits_on_a_bad_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLDSNAP_MODE", "sideways")
    with pytest.raises(SystemExit) as info:
        plugin.register()
    assert "COLDSNAP_MODE: 'sideways' is not one of: off, capture, restore" in str(info.value.code)


def test_register_is_inert_when_mode_is_off(
    monkeypatch: pytest.MonkeyPatch, clean_hook_registry: Any
) -> None:
    monkeypatch.delenv("COLDSNAP_MODE", raising=False)
    before = {k: list(v) for k, v in clean_hook_registry._hooks.items()}
    plugin.register()
    assert {k: list(v) for k, v in clean_hook_registry._hooks.items()} == before


def _target_fn(x: int) -> int:
    return x + 1


def test_hook_landed_sees_the_wrapper_chain(clean_hook_registry: Any) -> None:
    from sglang.srt.plugins.hook_registry import HookType

    def hook(original: Any, x: int) -> int:
        return original(x) * 10

    def other(original: Any, x: int) -> int:
        return original(x)

    target = f"{__name__}._target_fn"
    assert not hook_landed(target, hook)
    clean_hook_registry.register(target, hook, HookType.AROUND)
    clean_hook_registry.apply_hooks()
    try:
        assert _target_fn(1) == 20
        assert hook_landed(target, hook)
        assert not hook_landed(target, other)
    finally:
        globals()["_target_fn"] = globals()["_target_fn"].__wrapped__


def test_unapplied_hooks_stop_start_up(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, clean_hook_registry: Any
) -> None:
    from coldsnap.plugin import Settings

    monkeypatch.setattr(clean_hook_registry, "apply_hooks", classmethod(lambda cls: None))
    settings = Settings(mode="capture", runtime_dir=tmp_path)
    with pytest.raises(SystemExit) as info:
        plugin.install(settings, "scheduler")
    assert "hooks did not land" in str(info.value.code)
    assert "SchedulerWeightUpdaterManager.release_memory_occupation" in str(info.value.code)


# ------------------------------------------------------------------ variants across releases

_REPORT_0517 = """
import json
from coldsnap.engines.sglang.cpu import activate
activate()
import sglang
from coldsnap.plugin import _contracts as c
found = c.report()
print("COLDSNAP-REPORT " + json.dumps({
    "sglang": sglang.__file__,
    "problems": found.problems,
    "variants": found.variants(),
    "digest": found.digest,
    "plugin_digest": c.plugin_digest(),
}))
"""


@pytest.fixture(scope="module")
def report_0517() -> dict[str, Any]:
    """coldsnap's admission run in a child with the SGLang 0.5.17 overlay on PYTHONPATH."""
    import json
    import subprocess
    import sys

    from coldsnap.testing.sglang_cpu import ReleaseNotInstalled, release_env

    try:
        env = release_env("0.5.17")
    except ReleaseNotInstalled as exc:
        missing("sglang", str(exc))
    done = subprocess.run(
        [sys.executable, "-c", _REPORT_0517],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = [x for x in done.stdout.splitlines() if x.startswith("COLDSNAP-REPORT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("COLDSNAP-REPORT "))


def test_both_releases_are_admitted_each_with_its_own_variants(
    report_0517: dict[str, Any],
) -> None:
    from coldsnap.plugin._contracts import report

    assert "sglang-0.5.17" in report_0517["sglang"]
    assert report_0517["problems"] == []
    here = report()
    assert here.problems == ()
    for c in CONTRACTS:
        seen = {alt.seen_in: f"{alt.seen_in}:{alt.variant}" for alt in c.alternatives()}
        # 0.5.23 (the venv's) takes each contract's first variant; 0.5.17 its own where the
        # contract has one, else the shared one.
        assert here.variants()[c.key] == f"{c.seen_in}:{c.variant}", c.key
        assert report_0517["variants"][c.key] == seen.get("0.5.17", seen["0.5.23"]), c.key
    assert sum(1 for c in CONTRACTS if c.variants) == 9


def test_digests_name_the_variants_so_capsules_do_not_cross_builds(
    report_0517: dict[str, Any],
) -> None:
    from coldsnap.plugin import digest, plugin_digest

    assert report_0517["digest"] != digest()
    assert report_0517["plugin_digest"] != plugin_digest()
    assert report_0517["plugin_digest"].startswith("sha256:")


def test_a_build_meeting_no_variant_is_refused_naming_each_contract(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A synthetic build: the 0.5.23 tree with the ways both releases meet two contracts
    removed (no runner list and no model_runner property on the TP worker; no is_healthy and a
    health endpoint that never answers 503)."""
    import sglang.srt.entrypoints.http_server as http_server
    import sglang.srt.managers.tokenizer_manager as tm
    import sglang.srt.managers.tp_worker as tp_worker

    async def health_generate(request: Any) -> None:
        """Always healthy."""

    monkeypatch.delattr(tp_worker.TpModelWorker, "weight_update_runners")
    monkeypatch.delattr(tp_worker.TpModelWorker, "model_runner")
    monkeypatch.delattr(tp_worker.BaseTpWorker, "model_runner")
    monkeypatch.delattr(tm.TokenizerManager, "is_healthy")
    monkeypatch.setattr(http_server, "health_generate", health_generate)
    with pytest.raises(ContractError) as info:
        admit()
    text = str(info.value)
    assert set(info.value.contracts) == {"speculative worker", "tokenizer manager"}
    for key, variants in (
        (
            "TpModelWorker.weight_update_runners",
            ("'runner-list' (seen in 0.5.23)", "'model-runner' (seen in 0.5.17)"),
        ),
        (
            "TokenizerManager.is_healthy",
            ("'is-healthy' (seen in 0.5.23)", "'health-endpoint' (seen in 0.5.17)"),
        ),
    ):
        line = next(x for x in text.splitlines() if f"{key}: no variant met" in x)
        for variant in variants:
            assert f"variant {variant}" in line, line
    # health_generate is also a one-variant contract of its own: reported too.
    assert "health_generate no longer contains" in text
    monkeypatch.undo()
    assert check()[0] == []


def test_a_variant_that_needs_another_variant_is_not_taken_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """0.5.23 without finalize_startup_weight_load still defers the commit in load_model: the
    'none' variant (weights final in load_model) must not be taken."""
    import sglang.srt.model_executor.model_runner as mr

    monkeypatch.delattr(mr.ModelRunner, "finalize_startup_weight_load")
    problems, _ = check()
    assert [g for g, _ in problems] == ["loader"]
    assert (
        "needs sglang.srt.model_executor.model_runner.ModelRunner.load_model met by variant "
        "'load-commits', found variant 'deferred-commit'" in problems[0][1]
    )
    monkeypatch.undo()
    assert check()[0] == []
