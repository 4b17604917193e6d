"""The rank entry point (`coldsnap-engine-rank`): its arguments, the driver from --driver or
the capsule's record, the capsule's rank checked against --rank, and a runtime dir (a store)
that is never written: a workdir inside it, a missing part of its layout or a mode the store
would narrow is refused before the Machine opens it, and a run leaves every file and directory
in it as it was."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from coldsnap.cli._rank import rank
from coldsnap.machine import RestoreRequest, parse_request

from ..capsules.test_store_steps import _seal, model  # noqa: F401  (a fixture)


def _run(command, *args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(command, list(args), env=env)


def _tree(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every path under `root` with its mode, size and mtime."""
    out = {}
    for path in [root, *sorted(root.rglob("*"))]:
        st = os.stat(path, follow_symlinks=False)
        out[str(path.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture
def runtime(tmp_path: Path, model: Path) -> Path:  # noqa: F811
    _seal(tmp_path, model, payload=True)
    return tmp_path / "store"


def _args(runtime: Path, workdir: Path, *more: str) -> list[str]:
    return ["--runtime-dir", str(runtime), "--capsule", "cap", "--workdir", str(workdir), *more]


@pytest.mark.parametrize("driver", ["n610", "n580"])
def test_the_request_is_this_rank_s_capsule_by_digest_and_nothing_is_written(
    tmp_path: Path, runtime: Path, driver: str
) -> None:
    before = _tree(runtime)
    result = _run(rank, *_args(runtime, tmp_path / "op", "--rank", "0", "--print-request",
                               "--port", "31000", "--driver", driver))  # fmt: skip
    assert result.exit_code == 0, result.output
    request = parse_request(json.loads(result.stdout))
    assert isinstance(request, RestoreRequest)
    assert request.driver == driver and request.artifact.startswith("sha256:")
    assert request.store == str(runtime) and request.port == 31000 and request.engine == "toy"
    assert _tree(runtime) == before, "the entry point wrote into the runtime dir"


def test_the_rank_comes_from_the_environment_too(tmp_path: Path, runtime: Path) -> None:
    result = _run(rank, *_args(runtime, tmp_path / "op", "--print-request"),
                  env={"RANK": "0"})  # fmt: skip
    assert result.exit_code == 0, result.output
    missing = _run(rank, *_args(runtime, tmp_path / "op"), env={"RANK": ""})
    assert missing.exit_code == 2 and "--rank" in missing.output


def test_the_driver_defaults_to_the_capsule_s(tmp_path: Path, runtime: Path) -> None:
    result = _run(rank, *_args(runtime, tmp_path / "op", "--rank", "0", "--print-request"))
    assert result.exit_code == 0, result.output
    request = parse_request(json.loads(result.stdout))
    assert isinstance(request, RestoreRequest)
    assert (request.driver, request.provider) == ("n610", "native")


def test_another_rank_s_capsule_is_refused_naming_rank(tmp_path: Path, runtime: Path) -> None:
    result = _run(rank, *_args(runtime, tmp_path / "op", "--rank", "1"))
    assert result.exit_code == 2
    assert "field '--rank': capsule cap is rank 0 of 1, not rank 1" in result.stderr


def test_a_workdir_inside_the_runtime_dir_is_refused(runtime: Path) -> None:
    before = _tree(runtime)
    result = _run(rank, *_args(runtime, runtime / "ops" / "r0", "--rank", "0"))
    assert result.exit_code == 2 and "field '--workdir'" in result.stderr
    assert _tree(runtime) == before


def test_a_runtime_dir_missing_part_of_its_layout_is_refused_not_completed(
    tmp_path: Path, runtime: Path
) -> None:
    (runtime / "tmp").rmdir()
    before = _tree(runtime)
    result = _run(rank, *_args(runtime, tmp_path / "op", "--rank", "0"))
    assert result.exit_code == 2 and "tmp is missing (it is not created here)" in result.stderr
    assert _tree(runtime) == before and not (runtime / "tmp").exists()


def test_a_runtime_dir_the_store_would_chmod_is_refused_unchanged(
    tmp_path: Path, runtime: Path
) -> None:
    os.chmod(runtime / "objects", 0o755)
    before = _tree(runtime)
    result = _run(rank, *_args(runtime, tmp_path / "op", "--rank", "0"))
    assert result.exit_code == 2 and "has mode 755, not 700" in result.stderr
    assert _tree(runtime) == before


def test_a_runtime_dir_that_does_not_exist_is_named(tmp_path: Path) -> None:
    result = _run(rank, *_args(tmp_path / "nothing", tmp_path / "op", "--rank", "0"))
    assert result.exit_code == 2 and "field '--runtime-dir'" in result.stderr
    assert not (tmp_path / "nothing").exists()


@pytest.mark.parametrize("spelling", ["dotdot", "symlink", "runtime-symlink"])
def test_a_workdir_inside_the_runtime_dir_is_refused_however_spelled(
    tmp_path: Path, runtime: Path, spelling: str
) -> None:
    """`..` and symlinks are resolved before the comparison: each of these workdirs lies in the
    runtime dir, and the run must leave the runtime dir as it was."""
    given = runtime
    if spelling == "dotdot":
        workdir = tmp_path / "elsewhere" / ".." / runtime.name / "tmp" / "r0"
        (tmp_path / "elsewhere").mkdir()
    elif spelling == "symlink":
        (tmp_path / "link").symlink_to(runtime / "tmp")
        workdir = tmp_path / "link" / "r0"
    else:  # the runtime dir named through a link, the workdir by its real path
        given = tmp_path / "runtime-link"
        given.symlink_to(runtime)
        workdir = runtime / "tmp" / "r0"
    before = _tree(runtime)
    result = _run(rank, *_args(given, workdir, "--rank", "0"))
    assert result.exit_code == 2 and "field '--workdir'" in result.stderr, result.output
    assert _tree(runtime) == before, "the entry point wrote into the runtime dir"
