"""Which engine arguments a restore may change (SGLang's policy, through the engine adapter):
flags compare with their values in any order and spelling (`--a 1` or `--a=1`); reporting flags
and coldsnap's own may differ."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from coldsnap.engines._args import parse
from coldsnap.engines.sglang import SGLangCommandLine
from coldsnap.engines.sglang._cmdline import ALLOWED, OWNED

differences = SGLangCommandLine().engine_args_differences

_FLAG = st.from_regex(r"--[a-z][a-z-]{0,12}", fullmatch=True)
_VALUE = st.from_regex(r"[a-z0-9.]{1,6}", fullmatch=True)
_GROUP = st.tuples(_FLAG, st.lists(_VALUE, max_size=2))


def _flatten(groups: list[tuple[str, list[str]]]) -> list[str]:
    return [item for flag, values in groups for item in (flag, *values)]


def test_parse_groups_values_under_their_flag() -> None:
    assert parse(["--a", "1", "2", "--b", "--c=x", "--a", "-3"]) == {
        "--a": [("1", "2"), ("-3",)],
        "--b": [()],
        "--c": [("x",)],
    }
    assert parse(["pos", "--a"]) == {"": [("pos",)], "--a": [()]}


@given(st.lists(_GROUP, max_size=6, unique_by=lambda g: g[0]), st.randoms())
def test_the_order_of_flags_never_matters(groups, random) -> None:
    shuffled = list(groups)
    random.shuffle(shuffled)
    assert differences(_flatten(groups), _flatten(shuffled)) == []


@given(st.lists(_GROUP, min_size=1, max_size=6, unique_by=lambda g: g[0]), st.data())
def test_a_changed_value_is_named_with_both_sides(groups, data) -> None:
    index = data.draw(st.integers(0, len(groups) - 1))
    flag, values = groups[index]
    changed = [*values, "zz-new"]
    other = [*groups[:index], (flag, changed), *groups[index + 1 :]]
    found = differences(_flatten(groups), _flatten(other))
    if flag in ALLOWED | frozenset(OWNED):
        assert found == []
    else:
        assert [(d.field, d.expected, d.found) for d in found] == [
            (f"engine_args {flag}", " ".join((flag, *values)), " ".join((flag, *changed)))
        ]


def test_reporting_flags_and_coldsnaps_may_differ() -> None:
    assert (
        differences(
            ["--dtype", "float16", "--log-level", "info", "--port", "1"],
            ["--log-level=debug", "--enable-metrics", "--dtype", "float16", "--host", "0.0.0.0"],
        )
        == []
    )


def test_an_unknown_flag_is_engine_changing() -> None:
    (diff,) = differences([], ["--some-future-flag"])
    assert (diff.field, diff.expected, diff.found) == (
        "engine_args --some-future-flag", "absent", "--some-future-flag",
    )  # fmt: skip


def test_a_request_s_engine_args_are_checked_flag_by_flag() -> None:
    from coldsnap.engines.sglang._cmdline import check_engine_args

    assert check_engine_args(["--dtype", "half", "--dp-size=1", "--log-level", "info"]) == []
    found = check_engine_args(
        [
            "--tp-size=2",
            "--api-key",
            "k",
            "--pp-size",
            "2",
            "--host",
            "0.0.0.0",
            "--speculative-draft-model-path",
            "/d",
        ]
    )
    flags = [why.split()[0].rstrip(":") for field, why in found]
    assert {field for field, _ in found} == {"engine_args"}
    assert flags == [
        "--tp-size", "--api-key", "--pp-size", "--host", "--speculative-draft-model-path"
    ]  # fmt: skip


def test_the_launcher_refuses_a_flag_coldsnap_cannot_honour(tmp_path) -> None:
    from types import SimpleNamespace

    import pytest

    from coldsnap.engines.sglang import SGLangLauncher
    from coldsnap.engines.sglang._cmdline import EngineArgsError
    from coldsnap.machine import WeightSource

    request = SimpleNamespace(
        operation="capture",
        model=SimpleNamespace(path="/models/m"),
        tp=None,
        engine_args=("--admin-api-key", "k"),
    )
    with pytest.raises(EngineArgsError, match="--admin-api-key cannot be captured"):
        SGLangLauncher().command(
            request, tmp_path, weights=WeightSource(source="checkpoint", checkpoint="/models/m")
        )
