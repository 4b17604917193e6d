"""COLDSNAP_* settings: one validated object; bad values name the variable and what it accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from coldsnap.plugin import VARIABLES, Settings, SettingsError, load_settings, unknown_variables

BASE = {"COLDSNAP_MODE": "capture", "COLDSNAP_RUNTIME_DIR": "/run/cs"}


def test_defaults_are_inert() -> None:
    s = load_settings({})
    assert s == Settings()
    assert not s.active


def test_every_variable_of_the_design_is_parsed() -> None:
    env = {
        "COLDSNAP_MODE": "restore",
        "COLDSNAP_ARTIFACT_DIR": "/a/art",
        "COLDSNAP_PROCESS_ARTIFACT_ROOT": "/a/proc",
        "COLDSNAP_LIVE_BACKING": "disk",
        "COLDSNAP_RUNTIME_DIR": "/a/run",
        "COLDSNAP_ARTIFACT_PREVERIFIED": "1",
        "COLDSNAP_EXPORT_MODEL_PAYLOAD": "true",
        "COLDSNAP_SGLANG_STARTUP_SOURCE": "payload",
        "COLDSNAP_SGLANG_RECOVERY_LOAD_FORMAT": "safetensors",
        "COLDSNAP_ASYNC_CUDA_GRAPHS": "yes",
        "COLDSNAP_SHAPE_CALIBRATION": "record",
        "COLDSNAP_RANK_TIMEOUT_S": "12.5",
        "COLDSNAP_KEEP_RESIDUAL": "0",
    }
    assert set(env) == set(VARIABLES)
    s = load_settings(env)
    assert s == Settings(
        mode="restore",
        artifact_dir=Path("/a/art"),
        process_artifact_root=Path("/a/proc"),
        live_backing="disk",
        runtime_dir=Path("/a/run"),
        artifact_preverified=True,
        export_model_payload=True,
        startup_source="payload",
        recovery_load_format="safetensors",
        async_cuda_graphs=True,
        shape_calibration="record",
        rank_timeout_s=12.5,
        keep_residual=False,
    )


@pytest.mark.parametrize("raw", ["0", "-1", "soon", "nan", "inf", ""])
def test_a_rank_timeout_must_be_positive_seconds(raw: str) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings({"COLDSNAP_RANK_TIMEOUT_S": raw})
    assert err.value.variables == ("COLDSNAP_RANK_TIMEOUT_S",)


@pytest.mark.parametrize(
    ("name", "value", "accepted"),
    [
        ("COLDSNAP_MODE", "sideways", "off, capture, restore"),
        ("COLDSNAP_LIVE_BACKING", "gpu", "discard, cpu, disk"),
        ("COLDSNAP_LIVE_BACKING", "auto", "discard, cpu, disk"),
        ("COLDSNAP_LIVE_BACKING", "host_discard", "discard, cpu, disk"),
        ("COLDSNAP_KEEP_RESIDUAL", "keep", "0, 1, true, false"),
        ("COLDSNAP_SGLANG_STARTUP_SOURCE", "s3", "payload, checkpoint"),
        ("COLDSNAP_SGLANG_RECOVERY_LOAD_FORMAT", "gguf", "auto, safetensors, pt"),
        ("COLDSNAP_SHAPE_CALIBRATION", "maybe", "off, record"),
        ("COLDSNAP_ASYNC_CUDA_GRAPHS", "2", "0, 1, true, false"),
        ("COLDSNAP_EXPORT_MODEL_PAYLOAD", "please", "0, 1, true, false"),
        ("COLDSNAP_ARTIFACT_PREVERIFIED", "si", "0, 1, true, false"),
        ("COLDSNAP_RUNTIME_DIR", "relative/dir", "an absolute path"),
        ("COLDSNAP_ARTIFACT_DIR", "art", "an absolute path"),
        ("COLDSNAP_PROCESS_ARTIFACT_ROOT", "./p", "an absolute path"),
    ],
)
def test_bad_value_names_variable_and_accepted_values(name: str, value: str, accepted: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings({**BASE, name: value})
    assert info.value.variables == (name,)
    message = str(info.value)
    assert message.startswith(f"{name}: {value!r}")
    assert accepted in message


def test_all_problems_are_reported_at_once() -> None:
    with pytest.raises(SettingsError) as info:
        load_settings({"COLDSNAP_MODE": "x", "COLDSNAP_LIVE_BACKING": "y"})
    assert info.value.variables == ("COLDSNAP_MODE", "COLDSNAP_LIVE_BACKING")


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"COLDSNAP_MODE": "capture"}, "COLDSNAP_RUNTIME_DIR"),
        ({**BASE, "COLDSNAP_EXPORT_MODEL_PAYLOAD": "1"}, "COLDSNAP_ARTIFACT_DIR"),
        (
            {
                "COLDSNAP_MODE": "restore",
                "COLDSNAP_RUNTIME_DIR": "/r",
                "COLDSNAP_SGLANG_STARTUP_SOURCE": "payload",
            },
            "COLDSNAP_ARTIFACT_DIR",
        ),
        (
            {**BASE, "COLDSNAP_SGLANG_STARTUP_SOURCE": "payload", "COLDSNAP_ARTIFACT_DIR": "/a"},
            "COLDSNAP_SGLANG_STARTUP_SOURCE",
        ),
        ({**BASE, "COLDSNAP_LIVE_BACKING": "disk"}, "COLDSNAP_PROCESS_ARTIFACT_ROOT"),
    ],
)
def test_combinations_that_cannot_work_are_refused(env: dict[str, str], variable: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(env)
    assert variable in info.value.variables


def test_booleans_accept_common_spellings() -> None:
    for raw, want in [
        ("1", True),
        ("TRUE", True),
        ("on", True),
        ("0", False),
        ("no", False),
        ("", False),
    ]:
        assert load_settings({"COLDSNAP_ASYNC_CUDA_GRAPHS": raw}).async_cuda_graphs is want


def test_unknown_names_are_reported_not_refused() -> None:
    env = {**BASE, "COLDSNAP_EXPORT_MODEL_PAYLAOD": "1"}
    assert load_settings(env).mode == "capture"
    assert unknown_variables(env) == ["COLDSNAP_EXPORT_MODEL_PAYLAOD"]


@pytest.mark.parametrize(
    "settings",
    [
        Settings(),
        Settings(mode="capture", runtime_dir=Path("/r"), shape_calibration="record"),
        Settings(
            mode="restore",
            runtime_dir=Path("/r"),
            startup_source="payload",
            artifact_dir=Path("/a"),
            artifact_preverified=True,
            rank_timeout_s=12.5,
            keep_residual=False,
        ),
    ],
)
def test_the_launchers_environment_reads_back_as_the_same_record(settings: Settings) -> None:
    assert Settings.from_env(settings.to_env()) == settings


def test_a_record_the_plugin_would_refuse_is_never_written() -> None:
    with pytest.raises(SettingsError) as info:
        Settings(mode="restore", runtime_dir=Path("/r"), startup_source="payload").to_env()
    assert info.value.variables == ("COLDSNAP_ARTIFACT_DIR",)


def test_fields_named_always_are_written_even_at_their_default() -> None:
    """What an inherited environment must not decide is written whatever its value: a default
    as itself, a field without a value as the variable set to nothing (which reads back as
    unset)."""
    settings = Settings(mode="capture", runtime_dir=Path("/r"))
    env = settings.to_env(always=("keep_residual", "process_artifact_root", "rank_timeout_s"))
    assert "COLDSNAP_KEEP_RESIDUAL" not in settings.to_env()
    assert env["COLDSNAP_KEEP_RESIDUAL"] == "1"
    assert env["COLDSNAP_PROCESS_ARTIFACT_ROOT"] == ""
    assert float(env["COLDSNAP_RANK_TIMEOUT_S"]) == settings.rank_timeout_s
    assert Settings.from_env(env) == settings
    with pytest.raises(ValueError, match="no such field: colour"):
        settings.to_env(always=("colour",))
