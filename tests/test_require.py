"""The required-components switch (tests/_support.py): a missing component fails the test when
COLDSNAP_REQUIRE names it and skips it otherwise; an unknown name stops the run."""

from __future__ import annotations

import pytest

from tests import _support
from tests._support import REQUIRE_VAR, missing, required

pytest_plugins = ["pytester"]


def test_the_switch_reads_a_comma_separated_list() -> None:
    assert required({REQUIRE_VAR: " criu, sglang ,"}) == {"criu", "sglang"}
    assert required({REQUIRE_VAR: ""}) == frozenset()
    assert required({}) == frozenset()


def test_an_unknown_component_is_refused_by_name() -> None:
    with pytest.raises(pytest.UsageError, match=r"unknown component.*gpu.*known: criu, sglang"):
        required({REQUIRE_VAR: "criu,gpu"})


def test_a_missing_required_component_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REQUIRE_VAR, "criu,sglang")
    with pytest.raises(pytest.fail.Exception, match=r"criu is required.*no criu binary"):
        missing("criu", "no criu binary")


def test_a_missing_component_not_required_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REQUIRE_VAR, "sglang")
    with pytest.raises(pytest.skip.Exception, match="no criu binary"):
        missing("criu", "no criu binary")
    monkeypatch.delenv(REQUIRE_VAR)
    with pytest.raises(pytest.skip.Exception, match="SGLang absent"):
        missing("sglang", "SGLang absent")


def test_only_known_components_can_be_missing() -> None:
    with pytest.raises(ValueError, match="gpu"):
        missing("gpu", "no GPU")


MARKED = """
import pytest

@pytest.mark.criu
@pytest.mark.skipif(True, reason="the module's own skip")
def test_needs_criu():
    pass

def test_needs_nothing():
    pass
"""


@pytest.mark.parametrize(
    ("require", "outcome"),
    [("criu", {"errors": 1, "passed": 1}), ("", {"skipped": 1, "passed": 1})],
)
def test_the_suite_hook_applies_the_switch_to_marked_tests(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, require: str, outcome: dict
) -> None:
    """A test marked `criu` on a host without CRIU: an error when required (before its own
    `skipif` could skip it), a skip when not; an unmarked test runs either way."""
    pytester.makeconftest("from tests.conftest import pytest_configure, pytest_runtest_setup\n")
    pytester.makeini("[pytest]\nmarkers =\n    criu: needs CRIU\n")
    pytester.makepyfile(MARKED)
    monkeypatch.setattr(_support, "problem", lambda component: f"no {component} here")
    monkeypatch.setenv(REQUIRE_VAR, require)
    result = pytester.runpytest_inprocess("-p", "no:xdist", "-p", "no:cacheprovider")
    result.assert_outcomes(**outcome)
    if require:
        result.stdout.fnmatch_lines(
            ["*criu is required (COLDSNAP_REQUIRE) but missing: no criu here*"]
        )


def test_a_misspelt_switch_stops_the_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeconftest("from tests.conftest import pytest_configure, pytest_runtest_setup\n")
    pytester.makepyfile("def test_x():\n    pass\n")
    monkeypatch.setenv(REQUIRE_VAR, "cri")
    result = pytester.runpytest_inprocess("-p", "no:xdist", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown component(s) cri*"])
