"""An identity's engine build names the digests of the engine's source files (format 2): checked
name by name when read, compared file by file, and absent from a format-1 identity, which is
still read."""

from __future__ import annotations

import json

import attrs
import pytest

from coldsnap.artifacts import (
    EngineBuild,
    IncompatibleArtifact,
    RecordError,
    check_compatible,
    from_json,
    to_json,
)

A = "sha256:" + "aa" * 32
B = "sha256:" + "bb" * 32
CONTRACT = "sha256:" + "11" * 32


def _engine(**sources: str) -> EngineBuild:
    return EngineBuild(
        "sglang", "0.5.23", CONTRACT, {k.replace("__", "/"): v for k, v in sources.items()}
    )


def test_the_source_digests_round_trip_in_a_format_2_identity(make_identity) -> None:
    identity = make_identity(engine=_engine(sglang__srt__scheduler_py=A))
    data = json.loads(to_json(identity))
    assert data["format"] == 2
    assert data["engine"]["sources"] == {"sglang/srt/scheduler_py": A}
    assert from_json(to_json(identity), type(identity)) == identity


def test_a_format_1_identity_reads_without_sources_and_cannot_carry_them(make_identity) -> None:
    data = json.loads(to_json(make_identity()))
    data["format"] = 1
    del data["engine"]["sources"]
    old = from_json(json.dumps(data), type(make_identity()))
    assert (old.format, old.engine.sources) == (1, {})
    with pytest.raises(ValueError, match=r"engine\.sources: a format-1 identity cannot carry them"):
        attrs.evolve(old, engine=_engine(a__b_py=A))


@pytest.mark.parametrize(
    ("name", "digest", "message"),
    [
        ("/abs/path.py", A, r"sources\[/abs/path.py\]: .* is absolute"),
        ("sglang/../x.py", A, r"sources\[sglang/\.\./x.py\]: .*'\.\.'"),
        ("sglang/x.py", "md5:00", r"sources\[sglang/x.py\]: .* is not a digest"),
    ],
)
def test_a_bad_source_entry_is_refused_naming_it(
    make_identity, name: str, digest: str, message: str
) -> None:
    data = json.loads(to_json(make_identity()))
    data["engine"]["sources"] = {name: digest}
    with pytest.raises(RecordError, match=message):
        from_json(json.dumps(data), type(make_identity()))


def test_a_differing_source_file_is_named_in_the_refusal(make_identity) -> None:
    captured = make_identity(engine=_engine(sglang__a_py=A, sglang__b_py=A))
    runtime = make_identity(engine=_engine(sglang__a_py=A, sglang__b_py=B))
    with pytest.raises(IncompatibleArtifact) as info:
        check_compatible(captured, runtime)
    assert [d.field for d in info.value.differences] == ["engine.sources[sglang/b_py]"]
    assert "a new capture is needed" in str(info.value)
