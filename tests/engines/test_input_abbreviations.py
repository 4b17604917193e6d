"""A flag coldsnap reads, sets or refuses must be written in full: SGLang's argparse takes any
unambiguous prefix of a flag for the flag, so `--hos 0.0.0.0` after coldsnap's own `--host` would
move the engine while coldsnap prints 127.0.0.1. Refused on the launch command line and in a
request's engine arguments alike; checked against SGLang's own parser where SGLang is here."""

from __future__ import annotations

import pytest

from coldsnap.cli._cmdline import CommandLineError, parse_launch
from coldsnap.engines.sglang._cmdline import (
    ALLOWED,
    DRAFT_FLAGS,
    READ,
    abbreviation_problem,
    check_engine_args,
)

pytestmark = pytest.mark.xdist_group("host")  # the comparison imports SGLang (seconds of CPU)

LAUNCH = ["python", "-m", "sglang.launch_server", "--model-path", "/m"]
ABBREVIATED = [
    (["--model-pat", "/other"], "--model-pat"),
    (["--hos", "0.0.0.0"], "--hos"),
    (["--hos=0.0.0.0"], "--hos"),
    (["--por", "31999"], "--por"),
    (["--api-ke", "k"], "--api-ke"),
    (["--dp-si", "2"], "--dp-si"),
    (["--nnode", "2"], "--nnode"),
    (["--tp-siz", "2"], "--tp-siz"),
    (["--speculative-draft-model-p", "/d"], "--speculative-draft-model-p"),
    (["--"], "--"),
]


@pytest.mark.parametrize(("args", "flag"), ABBREVIATED)
def test_an_abbreviation_of_a_flag_coldsnap_reads_is_refused_on_the_command_line(
    args: list[str], flag: str
) -> None:
    with pytest.raises(CommandLineError) as caught:
        parse_launch([*LAUNCH, *args])
    assert [f for f, _ in caught.value.problems] == [flag]
    assert "in full" in str(caught.value) or flag == "--"


@pytest.mark.parametrize(("args", "flag"), ABBREVIATED)
def test_an_abbreviation_of_a_flag_coldsnap_reads_is_refused_in_engine_args(
    args: list[str], flag: str
) -> None:
    (problem,) = check_engine_args(["--dtype", "half", *args])
    assert problem[0] == "engine_args" and problem[1].startswith(f"{flag} ")


def test_an_abbreviation_of_another_engine_flag_goes_to_the_engine() -> None:
    line = parse_launch([*LAUNCH, "--mem-frac", "0.5", "--log-lev", "debug"])
    assert line.engine_args == ("--mem-frac", "0.5", "--log-lev", "debug")
    assert check_engine_args(["--mem-frac", "0.5"]) == []


def test_sglang_s_short_spelling_of_the_draft_model_is_read_as_the_draft() -> None:
    line = parse_launch([*LAUNCH, "--speculative-draft-model", "/d", "--dtype", "half"])
    assert line.draft_path == "/d" and line.engine_args == ("--dtype", "half")
    (problem,) = check_engine_args(["--speculative-draft-model", "/d"])
    assert "draft" in problem[1]


def test_the_older_spelling_of_the_distributed_address_is_refused() -> None:
    with pytest.raises(CommandLineError) as caught:
        parse_launch([*LAUNCH, "--nccl-init-addr", "10.0.0.1:5000"])
    assert [f for f, _ in caught.value.problems] == ["--nccl-init-addr"]


# -- against SGLang's own parser ------------------------------------------------------------------


@pytest.fixture(scope="module")
def sglang_flags(sglang_cpu: None) -> dict[str, str]:
    """Each option string of SGLang's server parser -> the attribute it sets (its dest), built
    the way `sglang.launch_server` builds it."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    assert parser.allow_abbrev  # what the refusal of abbreviations is for
    return {s: a.dest for a in parser._actions for s in a.option_strings}


def _resolve(flags: dict[str, str], token: str) -> str | None:
    """The dest SGLang's argparse reads `token` as: the flag itself, else the one flag it is
    an unambiguous prefix of (argparse's allow_abbrev); None when it reads no single flag."""
    if token in flags:
        return flags[token]
    matching = [f for f in flags if f.startswith(token)]
    return flags[matching[0]] if len(matching) == 1 else None


@pytest.mark.sglang
def test_every_spelling_sglang_has_of_a_flag_coldsnap_reads_is_read(
    sglang_flags: dict[str, str],
) -> None:
    dests = {_resolve(sglang_flags, flag) for flag in READ} - {None}
    missed = sorted(f for f, dest in sglang_flags.items() if dest in dests and f not in READ)
    assert missed == []  # an alias of a read flag would reach the engine unread


@pytest.mark.sglang
def test_no_sglang_flag_is_refused_as_an_abbreviation(sglang_flags: dict[str, str]) -> None:
    assert [f for f in sglang_flags if abbreviation_problem(f) is not None] == []
    assert [f for f in (*READ, *DRAFT_FLAGS) if _resolve(sglang_flags, f) is None] == []


@pytest.mark.sglang
def test_every_flag_a_restore_may_change_is_one_of_sglang_s_own(
    sglang_flags: dict[str, str],
) -> None:
    """A restore may change these by name: were one only a prefix of SGLang's flags, the
    engine would read it as a flag that shapes the engine."""
    assert sorted(ALLOWED - set(sglang_flags)) == []


@pytest.mark.sglang
def test_every_prefix_sglang_reads_as_a_read_flag_is_refused(
    sglang_flags: dict[str, str],
) -> None:
    read_dests = {_resolve(sglang_flags, flag) for flag in READ}
    slipping = [
        flag[:n]
        for flag in sglang_flags
        for n in range(3, len(flag))
        if _resolve(sglang_flags, flag[:n]) in read_dests
        and flag[:n] not in READ
        and abbreviation_problem(flag[:n]) is None
    ]
    assert slipping == []
