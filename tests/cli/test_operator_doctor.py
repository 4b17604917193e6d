"""`coldsnap doctor` as an operator meets it: fast (SGLang is imported only for --contracts),
a run without root names root as the fix of what it could not check, and a HOME it cannot write
is said in one line with its fix, not in a traceback. Also `coldsnap --version`."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from coldsnap.cli import _doctor, main

from .test_doctor import healthy  # noqa: F401  (the fixture: every requirement met)


def _checks(*args: str) -> tuple[int, dict[str, dict[str, str]]]:
    result = CliRunner().invoke(main, ["doctor", "--json", *args])
    rows = json.loads(result.stdout)["checks"]
    return result.exit_code, {r["name"]: r for r in rows}


def test_without_root_the_unchecked_lines_say_run_as_root(
    healthy: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    healthy.setattr(os, "geteuid", lambda: 1000)
    code, checks = _checks()
    assert code == 5
    assert checks["root"]["fix"] == "run coldsnap as root (CRIU needs it)"
    for name in ("criu-check", "amx-patch", "seccomp-filters"):
        assert checks[name]["detail"].startswith("not checked: needs root"), checks[name]
        assert checks[name]["fix"] == "run `coldsnap doctor` as root to check this"


def test_without_criu_the_lines_that_need_it_point_at_the_criu_line(
    healthy: pytest.MonkeyPatch,  # noqa: F811
    tmp_path: object,
) -> None:
    healthy.setenv("COLDSNAP_CRIU", "/nonexistent/criu")
    _, checks = _checks()
    assert checks["criu"]["status"] == "missing"
    assert checks["criu-check"]["fix"] == "fix the criu line first"


def test_the_default_check_does_not_run_the_contract_check(
    healthy: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    def imports_sglang() -> None:
        raise AssertionError("the contract check ran without --contracts")

    healthy.setattr(_doctor, "sglang_report", imports_sglang)
    code, checks = _checks()
    assert code == 0, checks
    assert checks["sglang"]["detail"] == (
        "SGLang 0.5.23 installed (contracts not checked: pass --contracts)"
    )


def test_a_home_it_cannot_write_is_one_line_with_its_fix(
    healthy: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    def no_home() -> None:
        raise FileNotFoundError(2, "No such file or directory", "/proc/nohome")

    healthy.setattr(_doctor, "sglang_report", no_home)
    result = CliRunner().invoke(main, ["doctor", "--contracts"])
    assert result.exit_code == 5
    assert result.exception is None or isinstance(result.exception, SystemExit)
    line = next(x for x in result.stdout.splitlines() if x.split()[1] == "sglang")
    assert "No such file or directory: /proc/nohome" in line
    assert "fix: set HOME to a directory you can write" in line


def test_doctor_imports_neither_sglang_nor_torch() -> None:
    code = (
        "import sys\n"
        "from coldsnap.cli import main\n"
        "try:\n"
        "    main(['doctor', '--json'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('sglang' in sys.modules, 'torch' in sys.modules, file=sys.stderr)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stderr.split()[-2:] == ["False", "False"], out.stderr


def test_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert result.stdout == f"main {importlib.metadata.version('coldsnap')}\n"
