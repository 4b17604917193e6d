"""What libraries say while a capture or restore runs goes to a log in its workdir, not between
the progress lines: a capture imports the engine in this process to name its build (SGLang warns
about kernels a CPU host lacks, torch and transformers about deprecations), and those lines
would otherwise cut into the live display. The engine's own output already goes to its log
(`engine.log`); coldsnap's own warnings still reach stderr."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

LOG_NAME = "libraries.log"
"""The file in the operation's workdir that takes the libraries' warnings and log records."""
_OURS = "coldsnap"


class _ToFile(logging.FileHandler):
    """A file handler that makes the file (and its folder: the workdir is made by the
    operation's first step) only when there is something to write."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, delay=True, encoding="utf-8")

    def emit(self, record: logging.LogRecord) -> None:
        if self.stream is None:  # type: ignore[has-type]
            Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        super().emit(record)


def _theirs(record: logging.LogRecord) -> bool:
    return not (record.name == _OURS or record.name.startswith(_OURS + "."))


@contextlib.contextmanager
def libraries_to_log(workdir: str | Path) -> Iterator[Path]:
    """Sends Python warnings and other packages' log records to WORKDIR/libraries.log for the
    duration; coldsnap's own records at WARNING and above go to stderr as before."""
    path = Path(workdir) / LOG_NAME
    to_file = _ToFile(path)
    to_file.addFilter(_theirs)
    to_file.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    ours = logging.StreamHandler(sys.stderr)
    ours.addFilter(lambda record: not _theirs(record))
    ours.setLevel(logging.WARNING)
    root = logging.getLogger()
    root.addHandler(to_file)
    root.addHandler(ours)
    logging.captureWarnings(True)
    try:
        yield path
    finally:
        logging.captureWarnings(False)
        root.removeHandler(ours)
        root.removeHandler(to_file)
        to_file.close()


__all__ = ["LOG_NAME", "libraries_to_log"]
