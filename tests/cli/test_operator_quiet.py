"""While a capture or restore runs, libraries' warnings and log records go to the workdir's
libraries.log instead of between the progress lines; coldsnap's own warnings still reach
stderr, and everything is as before once the operation ends."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest

from coldsnap.cli._quiet import LOG_NAME, libraries_to_log


def test_libraries_speak_to_the_log_and_coldsnap_to_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workdir = tmp_path / "ops" / "capture-1"  # made by the operation, after this starts
    with libraries_to_log(workdir) as path:
        warnings.warn("a kernel this host lacks", UserWarning, stacklevel=1)
        logging.getLogger("sglang.srt.layers").warning("falling back to torch")
        logging.getLogger("coldsnap.machine").warning("a subscriber failed")
    err = capsys.readouterr().err
    assert path == workdir / LOG_NAME
    text = path.read_text()
    assert "a kernel this host lacks" in text and "falling back to torch" in text
    assert "a kernel this host lacks" not in err and "falling back to torch" not in err
    assert "a subscriber failed" in err and "a subscriber failed" not in text
    before = len(logging.getLogger().handlers)
    with pytest.warns(UserWarning):  # warnings are warnings again
        warnings.warn("after", UserWarning, stacklevel=1)
    assert len(logging.getLogger().handlers) == before


def test_nothing_said_makes_no_file(tmp_path: Path) -> None:
    with libraries_to_log(tmp_path / "w"):
        pass
    assert not (tmp_path / "w").exists()


def test_a_restore_s_library_warnings_land_in_its_workdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from coldsnap.artifacts import Store
    from coldsnap.cli import main
    from coldsnap.machine import Machine

    from .test_operator_errors import _publish

    restore = Machine.restore

    def warning_restore(self: Machine, *args: object, **kw: object) -> object:
        warnings.warn("torch says something", UserWarning, stacklevel=1)
        return restore(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Machine, "restore", warning_restore)
    monkeypatch.setenv("COLDSNAP_SERVING_DIR", str(tmp_path / "serving"))
    _publish(Store(tmp_path / "store"), "tiny")
    result = CliRunner().invoke(main, ["restore", "tiny", "--store", str(tmp_path / "store")])
    assert result.exit_code == 3, result.output  # a stand-in capsule: admission refuses it
    assert "torch says something" not in result.output
    (log,) = (tmp_path / "ops").glob(f"restore-tiny-*/{LOG_NAME}")
    assert "torch says something" in log.read_text()
