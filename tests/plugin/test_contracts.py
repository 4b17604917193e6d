"""Admission: the plugin checks the installed SGLang's contracts by structure and fails closed
(with SystemExit, since SGLang only logs plugin exceptions) naming the contract."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import coldsnap.plugin as plugin
from coldsnap.plugin import CONTRACTS, GROUPS, ContractError, admit, check, hook_landed

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
