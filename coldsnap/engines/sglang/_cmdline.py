"""SGLang's launch-line policy: how a user's own command line (`python -m sglang.launch_server
--model-path M ...` or `sglang serve ...`) becomes a capture request's fields, which flags
coldsnap sets itself, refuses or lets differ at restore. The command line and the store ask the
engine adapter (`SGLangEngine`, through `SGLangCommandLine`) and never name a flag themselves.

Reading a launch line: coldsnap owns only where the engine listens (`--host` and `--port` are
taken out and kept in the capsule, where a restore serves unless told otherwise), the
tensor-parallel size becomes the request's `tp` and the draft model its `draft`; `--api-key KEY`
becomes the bare flag `--api-key` (the key is dropped: the engine is keyed, and each restore is
given its key, coldsnap.engines.sglang._keys); a flag coldsnap cannot honour is refused by name,
with why; every other flag goes to the engine as written.

SGLang reads its flags with argparse, which takes any unambiguous prefix of a flag for the flag
(`--hos` is `--host`), and the user's flags follow coldsnap's own on the engine's command line.
So a flag coldsnap reads or refuses must be written in full: a token that is a proper prefix of
one (`--model-pat`, `--tp-siz`, `--por`) is refused by name, on the command line and in a
request's engine arguments alike. Telling which abbreviations SGLang would resolve needs its
parser, which costs seconds to import; refusing every prefix of coldsnap's own flags needs none,
and refuses no flag SGLang has: its flags that are prefixes of these (`--model`,
`--speculative-draft-model`) are read here too (tests compare with SGLang's own parser).

Comparing engine arguments at restore: a capsule is an engine built with the capture's
arguments (n610 restores that very process; n580 builds the engine again with the restore's),
so every argument that shapes the engine (dtype, memory fraction, context length, attention
backend, quantization, anything unknown) must be the same. Allowed to differ: the flags that
only change what the engine reports (`ALLOWED`) and coldsnap's own (`OWNED`). Flags compare
with their values in any order and spelling (`--a 1 --b` equals `--b --a=1`); a flag given twice
keeps both values, in order.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence

from coldsnap._errors import RefusedError
from coldsnap.artifacts import Difference
from coldsnap.engines._args import differences
from coldsnap.machine import CommandLineError, LaunchLine

from ._keys import KEY_FLAG
from ._options import check_engine_options, options_differences

MODULE = "sglang.launch_server"
MODEL_FLAGS = ("--model-path", "--model")
TP_FLAGS = ("--tp-size", "--tp", "--tensor-parallel-size")
OWNED = ("--host", "--port")
"""Flags coldsnap sets on every launch."""
DRAFT_FLAGS = ("--speculative-draft-model-path", "--speculative-draft-model-revision")
"""The draft model becomes the request's `draft` (the capsule binds it)."""
DRAFT_PATH_FLAGS = (DRAFT_FLAGS[0], "--speculative-draft-model")
"""The draft model's path, in each spelling SGLang accepts."""
ONE = {
    "--pp-size": "a capsule holds one pipeline stage",
    "--pipeline-parallel-size": "a capsule holds one pipeline stage",
    "--dp-size": "a capsule holds one data-parallel replica",
    "--data-parallel-size": "a capsule holds one data-parallel replica",
    "--nnodes": "a capsule holds the processes of one host",
}
"""Flags coldsnap honours only at their default of 1, with why."""
REFUSED = {
    "--config": "coldsnap must see every flag (model, host, port): pass them on the command line",
    "--admin-api-key": (
        "the admin key would be captured with the server (its command line and server "
        "arguments are process memory the snapshot holds), and coldsnap hands over only "
        "--api-key at restore: capture without it (docs/cli.md, API keys)"
    ),
    "--ssl-keyfile": "coldsnap speaks plain HTTP to the engine",
    "--ssl-certfile": "coldsnap speaks plain HTTP to the engine",
    "--skip-tokenizer-init": "the acceptance request sends text, which needs the tokenizer",
    "--grpc-mode": "coldsnap drives the engine through its HTTP endpoints",
    "--smg-grpc-mode": "coldsnap drives the engine through its HTTP endpoints",
    "--node-rank": "a capsule holds the processes of one host",
    "--dist-init-addr": "a capsule holds the processes of one host",
    "--nccl-init-addr": "a capsule holds the processes of one host",
}
"""Flags coldsnap cannot honour at all, with why."""
ALLOWED: frozenset[str] = frozenset(
    {
        "--log-level",
        "--log-level-http",
        "--log-requests",
        "--log-requests-level",
        "--show-time-cost",
        "--decode-log-interval",
        "--enable-metrics",
        "--enable-request-time-stats-logging",
        "--crash-dump-folder",
    }
)
"""Flags that change what an engine reports, never what it computes or how it is laid out."""

_VALUED = (*MODEL_FLAGS, *TP_FLAGS, *OWNED, *DRAFT_PATH_FLAGS, DRAFT_FLAGS[1], *ONE, "--config",
           KEY_FLAG, "--admin-api-key", "--ssl-keyfile", "--ssl-certfile", "--node-rank",
           "--dist-init-addr", "--nccl-init-addr")  # fmt: skip
"""Flags read here that take a value (as `--flag value` or `--flag=value`) on a launch line. In a
request's engine arguments `--api-key` takes none: a request never holds a key."""
_VALUED_IN_REQUEST = tuple(f for f in _VALUED if f != KEY_FLAG)
READ: frozenset[str] = frozenset(
    (*MODEL_FLAGS, *TP_FLAGS, *OWNED, *DRAFT_PATH_FLAGS, DRAFT_FLAGS[1], *ONE, *REFUSED, KEY_FLAG)
)
"""Every flag coldsnap reads, sets or refuses: each must be written in full."""
_PYTHON = re.compile(r"^python(3(\.\d+)?)?$")


# -- reading a launch command line ------------------------------------------------------------


def _flags(
    argv: Sequence[str], valued: Sequence[str] = _VALUED
) -> list[tuple[str, str | None, list[str]]]:
    """(flag, its value or None, the tokens it took) for each flag; a bare token that follows
    no flag of `valued` comes back as ('', token, [token])."""
    out: list[tuple[str, str | None, list[str]]] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        name, eq, inline = token.partition("=")
        if token.startswith("--") and name in valued:
            if eq:
                out.append((name, inline, [token]))
                i += 1
                continue
            if i + 1 >= len(argv):
                raise CommandLineError([(name, "is missing its value")])
            out.append((name, argv[i + 1], [token, argv[i + 1]]))
            i += 2
            continue
        out.append((name if token.startswith("--") else "", None if token.startswith("--")
                    else token, [token]))  # fmt: skip
        i += 1
    return out


def abbreviation_problem(flag: str) -> str | None:
    """Why `flag` (a token's name, before any '=') cannot go to the engine as written: it is a
    proper prefix of flags coldsnap reads, which SGLang would take for one of them; None when
    it is not."""
    if not flag.startswith("--") or flag in READ:
        return None
    if flag == "--":
        return "ends SGLang's options: what follows would not be read as flags"
    meant = sorted(name for name in READ if name.startswith(flag))
    if not meant:
        return None
    return (f"abbreviates {' or '.join(meant)}, which coldsnap reads: write the flag in full "
            "(SGLang takes a prefix of a flag for the flag)")  # fmt: skip


def _program(argv: Sequence[str]) -> tuple[str, list[str]]:
    head = os.path.basename(argv[0]) if argv else ""
    if _PYTHON.match(head) and len(argv) >= 3 and argv[1] == "-m" and argv[2] == MODULE:
        return f"python -m {MODULE}", list(argv[3:])
    if head == "sglang" and len(argv) >= 2 and argv[1] == "serve":
        return "sglang serve", list(argv[2:])
    shown = " ".join(argv[:3]) or "nothing"
    raise CommandLineError(
        [
            (
                "command",
                f"coldsnap captures `python -m {MODULE} ...` or `sglang serve ...`, got `{shown}`",
            )
        ]
    )


def _int(flag: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise CommandLineError([(flag, f"must be an integer, got {value!r}")]) from None


def parse_command_line(argv: Sequence[str]) -> LaunchLine:
    """The launch command line `argv`, read as the module's docstring says; CommandLineError
    naming every flag it cannot capture."""
    program, rest = _program(argv)
    model: str | None = None
    tp, host, port = 1, None, None
    draft: dict[str, str | None] = {}
    kept: list[str] = []
    problems: list[tuple[str, str]] = []
    for flag, value, tokens in _flags(rest):
        if (why := abbreviation_problem(flag)) is not None:
            problems.append((flag, why))
        elif flag in MODEL_FLAGS:
            model = value
        elif flag == "--host":
            host = value
        elif flag == "--port":
            port = _int(flag, value or "")
        elif flag in DRAFT_PATH_FLAGS:
            draft[DRAFT_FLAGS[0]] = value
        elif flag == DRAFT_FLAGS[1]:
            draft[flag] = value
        elif flag == KEY_FLAG:
            kept.append(KEY_FLAG)  # keyed; the key itself is never captured nor kept
        elif flag in REFUSED:
            problems.append((flag, f"cannot be captured: {REFUSED[flag]}"))
        elif flag in ONE and _int(flag, value or "") != 1:
            problems.append((flag, f"must be 1 (got {value}): {ONE[flag]}"))
        elif flag in TP_FLAGS:
            tp = _int(flag, value or "")  # the request's tp: the launcher sets --tp-size from it
        else:
            kept += tokens
    if model is None:
        problems.append(("--model-path", "is missing: the command line must name the model"))
    if problems:
        raise CommandLineError(problems)
    if DRAFT_FLAGS[1] in draft and DRAFT_FLAGS[0] not in draft:
        raise CommandLineError([(DRAFT_FLAGS[1], f"needs {DRAFT_FLAGS[0]}")])
    assert model is not None
    return LaunchLine(
        model_path=model,
        tp=tp,
        engine_args=tuple(kept),
        host=host,
        port=port,
        program=program,
        owned=OWNED,
        draft_path=draft.get(DRAFT_FLAGS[0]),
        draft_revision=draft.get(DRAFT_FLAGS[1]),
    )


class EngineArgsError(RefusedError, ValueError):
    """A request's engine arguments hold a flag coldsnap sets itself, takes from another field,
    or cannot honour; the message names each flag and why."""


def check_engine_args(args: Sequence[str]) -> list[tuple[str, str]]:
    """("engine_args", why) for each flag of a request's engine arguments that coldsnap sets
    itself (where the engine listens), takes from another request field (the tensor-parallel
    size, the draft model), or cannot honour; empty when every flag may go to the engine."""
    problems: list[tuple[str, str]] = []
    flags = _flags(list(args), _VALUED_IN_REQUEST)
    for at, (flag, value, tokens) in enumerate(flags):
        follows = flags[at + 1] if at + 1 < len(flags) else None
        if (why := abbreviation_problem(flag)) is not None:
            problems.append(("engine_args", f"{flag} {why}"))
        elif flag == KEY_FLAG and (tokens[0] != KEY_FLAG or (follows and not follows[0])):
            problems.append(("engine_args", f"{KEY_FLAG} takes no value in a request: it says "
                             "the engine is keyed, and the key is given to each restore apart "
                             "from its request (docs/cli.md, API keys)"))  # fmt: skip
        elif flag in OWNED:
            problems.append(("engine_args", f"{flag} is coldsnap's to set (the request's host "
                             "and port say where the engine listens)"))  # fmt: skip
        elif flag in TP_FLAGS:
            problems.append(("engine_args", f"{flag} is not accepted; the tensor-parallel size "
                             "is the request's field tp (the capsule binds it)"))  # fmt: skip
        elif flag in (*DRAFT_PATH_FLAGS, DRAFT_FLAGS[1]):
            problems.append(("engine_args", f"{flag}: name the draft model in the field 'draft'"))
        elif flag in REFUSED:
            problems.append(("engine_args", f"{flag} cannot be captured: {REFUSED[flag]}"))
        elif flag in ONE and value != "1":
            problems.append(("engine_args", f"{flag} must be 1 (got {value}): {ONE[flag]}"))
    return problems


_PARSER_ERROR = re.compile(r"^[^\n]*?: error: [^\n]+$", re.MULTILINE)
"""argparse's last line when it refuses a command line (`sglang serve: error: ...`,
`launch_server.py: error: ...`), printed after the whole usage text (hundreds of lines for
SGLang's flags)."""
_USAGE = re.compile(r"^\s*\[--|^usage: ", re.MULTILINE)


def refused_line(log: str) -> str | None:
    """The line in which SGLang's parser refused its command line (a mistyped or unknown flag,
    a bad value), found in the engine's log `log` (its tail: the usage text's first line may be
    cut off, its flag lines are not); None when the log shows no refused command line. The
    usage text before it names every flag SGLang has and nothing about the one that is wrong."""
    found = _PARSER_ERROR.findall(log)
    if not found or _USAGE.search(log) is None:
        return None
    return found[-1].strip()


class SGLangCommandLine:
    """The launch-line policy as the engine adapter's methods (`SGLangEngine` inherits them)."""

    @staticmethod
    def check_engine_args(args: Sequence[str]) -> list[tuple[str, str]]:
        """(field, why) for every engine argument of a request coldsnap cannot pass on (static:
        the registry asks the class before building an adapter)."""
        return check_engine_args(args)

    @staticmethod
    def check_engine_options(options: Mapping[str, str]) -> list[tuple[str, str]]:
        """(`engine_options.<key>`, why) for every option SGLang's adapter does not know or
        whose value it cannot take (static, as check_engine_args)."""
        return check_engine_options(options)

    def parse_command_line(self, argv: Sequence[str]) -> LaunchLine:
        """The user's launch command line as a capture request's fields."""
        return parse_command_line(argv)

    def engine_args_differences(
        self, captured: Iterable[str], requested: Iterable[str]
    ) -> list[Difference]:
        """The engine-changing arguments a restore would change, each a Difference."""
        return differences(captured, requested, may_differ=ALLOWED | frozenset(OWNED))

    def engine_options_differences(
        self, captured: Mapping[str, str], requested: Mapping[str, str]
    ) -> list[Difference]:
        """The engine options a restore would change (every option binds: _options)."""
        return options_differences(captured, requested)


__all__ = [
    "ALLOWED",
    "DRAFT_FLAGS",
    "DRAFT_PATH_FLAGS",
    "MODULE",
    "ONE",
    "OWNED",
    "READ",
    "REFUSED",
    "TP_FLAGS",
    "EngineArgsError",
    "SGLangCommandLine",
    "abbreviation_problem",
    "check_engine_args",
    "parse_command_line",
    "refused_line",
]
