"""Reading and verifying a pack (a restore's stage, in the orchestrator) needs no torch: the
index's dtypes are checked against coldsnap's own table of torch's dtypes, which must name every
dtype of the installed torch with its element size."""

from __future__ import annotations

import subprocess
import sys

from coldsnap.providers._layout import DTYPE_SIZES


def test_the_dtype_table_is_torch_s() -> None:
    import torch

    installed = {
        str(d).removeprefix("torch."): d.itemsize
        for d in vars(torch).values()
        if isinstance(d, torch.dtype)
    }
    assert {n: DTYPE_SIZES.get(n) for n in installed} == installed


def test_the_providers_and_their_registration_import_no_torch() -> None:
    code = (
        "import sys, coldsnap.providers, coldsnap.providers._steps; "
        "from coldsnap.providers.native import PackDirectory, verify_pack; "
        "print('torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "False", done.stderr[-2000:]
