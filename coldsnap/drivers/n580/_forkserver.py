"""Runs inside the template's multiprocessing forkserver (imported there as a preload module).

SGLang starts its scheduler and detokenizer with the `spawn` method, which re-imports torch and
SGLang in every child: most of a cold start. A template can instead start a forkserver that has
imported them before the snapshot; children forked from it start warm. Two things differ from
spawn, and this module puts them right in the forked child before its target runs:
- the environment: a forkserver child inherits the forkserver's, frozen when the template was
  launched; the template sends its current one (after release) in the preparation data;
- the random state: every restored copy of the template would hand out the same one.
"""

from __future__ import annotations

import multiprocessing.spawn as _spawn
import os
import random
import sys
from typing import Any

ENV_KEY = "coldsnap_env"
_original_prepare = _spawn.prepare


def reseed() -> None:
    seed = int.from_bytes(os.urandom(8), "little")
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed % 2**32)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed % 2**63)


def _unique_preload(env: dict[str, str]) -> dict[str, str]:
    """The template's LD_PRELOAD already holds the memory saver's hook; SGLang prepends it again
    before it spawns a scheduler, and the memory saver refuses a path listed twice."""
    value = env.get("LD_PRELOAD")
    if value:
        env["LD_PRELOAD"] = ":".join(dict.fromkeys(p for p in value.split(":") if p))
    return env


def _prepare(data: dict[str, Any]) -> None:
    env = data.pop(ENV_KEY, None)
    if env is not None:
        os.environ.clear()
        os.environ.update(_unique_preload(env))
        reseed()
    _original_prepare(data)


_spawn.prepare = _prepare


def begin(preload: list[str]) -> None:
    """Called in the template: starts the forkserver, which imports `preload` in its own process
    while the template imports its own modules (on a CPU host the two imports then share the
    cores instead of running one after the other: about half of a capture's template launch).
    `ready` waits for it and routes SGLang's `spawn` to it."""
    import multiprocessing
    import multiprocessing.forkserver as forkserver

    original = _spawn.get_preparation_data

    def with_env(name: str) -> dict[str, Any]:
        data = original(name)
        data[ENV_KEY] = dict(os.environ)
        return data

    _spawn.get_preparation_data = with_env
    multiprocessing.set_forkserver_preload([__name__, *preload])
    forkserver.ensure_running()


def ready() -> str:
    """Waits until the forkserver `begin` started has imported its modules, then routes SGLang's
    `spawn` to it. Returns the forkserver's socket address, whose directory a restore must
    re-create."""
    import multiprocessing
    import multiprocessing.forkserver as forkserver

    # The forkserver imports its preload list before it serves anyone: one trivial child
    # proves it has finished, so the snapshot holds a warm forkserver, not a half-imported one.
    child = multiprocessing.get_context("forkserver").Process(target=os.getpid)
    child.start()
    child.join()
    set_start_method = multiprocessing.set_start_method

    def spawn_is_forkserver(method: str | None, force: bool = False) -> None:
        set_start_method("forkserver" if method == "spawn" else method, force=force)

    multiprocessing.set_start_method = spawn_is_forkserver  # type: ignore[assignment]
    return str(forkserver._forkserver._forkserver_address)  # type: ignore[attr-defined]


def start(preload: list[str]) -> str:
    """`begin` then `ready`: a warm forkserver that SGLang's `spawn` goes to."""
    begin(preload)
    return ready()
