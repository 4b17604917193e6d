"""A capsule as an OCI artifact and back (coldsnap.oci._mapping), and references: no registry,
pure functions."""

from __future__ import annotations

import hashlib
import json

import pytest

from coldsnap.artifacts import Capsule, Member, record_digest, to_json
from coldsnap.oci import (
    ArtifactRefused,
    artifact_of,
    capsule_of,
    docker_configs,
    parse_reference,
    read_manifest,
)
from coldsnap.oci._mapping import ARTIFACT_TYPE, CONFIG_MEDIA_TYPE, MANIFEST_MEDIA_TYPE


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _capsule() -> Capsule:
    return Capsule(
        members=(
            Member(role="process-image", name="images/pages-1.img", digest=_digest(b"a"), size=1),
            Member(role="pack", name="packs/0.pack", digest=_digest(b"bb"), size=2),
            Member(role="pack", name="packs/1.pack", digest=_digest(b"a"), size=1),
        )
    )


def test_a_capsule_is_one_manifest_its_config_the_capsule_its_layers_the_members() -> None:
    capsule = _capsule()
    config = to_json(capsule)
    artifact = artifact_of(capsule, config, "tiny")
    body = json.loads(artifact.manifest)
    assert body["mediaType"] == MANIFEST_MEDIA_TYPE and body["artifactType"] == ARTIFACT_TYPE
    assert body["config"] == {"mediaType": CONFIG_MEDIA_TYPE, "digest": record_digest(capsule),
                              "size": len(config)}  # fmt: skip
    layers = [(x["digest"], x["size"], x["annotations"]["org.opencontainers.image.title"])
              for x in body["layers"]]  # fmt: skip
    assert layers == [(m.digest, m.size, m.name) for m in capsule.members]
    assert body["annotations"] == {"dev.coldsnap.tag": "tiny"}
    # a blob two members share is sent once; the config goes first
    assert [b.digest for b in artifact.blobs()] == [
        record_digest(capsule),
        _digest(b"a"),
        _digest(b"bb"),
    ]


def test_read_back_gives_the_same_capsule_and_tag() -> None:
    capsule = _capsule()
    config = to_json(capsule)
    served = read_manifest(artifact_of(capsule, config, "tiny").manifest, "r")
    assert served.tag == "tiny" and served.config.digest == record_digest(capsule)
    assert capsule_of(served, config, "r") == capsule


def test_a_manifest_of_another_kind_is_refused_naming_its_types() -> None:
    capsule = _capsule()
    body = json.loads(artifact_of(capsule, to_json(capsule), None).manifest)
    body["artifactType"] = "application/vnd.example.thing"
    with pytest.raises(ArtifactRefused, match=r"not a coldsnap capsule.*vnd\.example\.thing"):
        read_manifest(json.dumps(body).encode(), "r")
    with pytest.raises(ArtifactRefused, match="not an OCI image manifest"):
        read_manifest(json.dumps({**body, "mediaType": "x"}).encode(), "r")
    body = json.loads(artifact_of(capsule, to_json(capsule), None).manifest)
    body["layers"][0]["digest"] = "md5:abc"
    with pytest.raises(ArtifactRefused, match=r"layers\[0\].digest"):
        read_manifest(json.dumps(body).encode(), "r")


def test_layers_that_disagree_with_the_capsule_are_refused() -> None:
    capsule = _capsule()
    config = to_json(capsule)
    body = json.loads(artifact_of(capsule, config, None).manifest)
    body["layers"][1]["annotations"]["org.opencontainers.image.title"] = "packs/other.pack"
    served = read_manifest(json.dumps(body).encode(), "r")
    with pytest.raises(ArtifactRefused, match=r"disagree.*first difference at 1"):
        capsule_of(served, config, "r")
    body["layers"] = body["layers"][:2]
    served = read_manifest(json.dumps(body).encode(), "r")
    with pytest.raises(ArtifactRefused, match="2 layers, 3 members"):
        capsule_of(served, config, "r")


def test_a_config_that_is_not_a_canonical_capsule_is_refused() -> None:
    capsule = _capsule()
    config = to_json(capsule)
    spaced = json.dumps(json.loads(config), indent=1).encode()  # same capsule, other bytes
    body = json.loads(artifact_of(capsule, config, None).manifest)
    body["config"].update(digest=_digest(spaced), size=len(spaced))
    served = read_manifest(json.dumps(body).encode(), "r")
    with pytest.raises(ArtifactRefused, match="not in canonical form"):
        capsule_of(served, spaced, "r")
    with pytest.raises(ArtifactRefused, match="not a capsule"):
        capsule_of(served, b'{"kind": "coldsnap.capsule"}', "r")


@pytest.mark.parametrize(
    ("text", "registry", "repository", "tag", "digest"),
    [
        ("127.0.0.1:5000/coldsnap/tiny:v1", "127.0.0.1:5000", "coldsnap/tiny", "v1", None),
        ("registry.example/tiny", "registry.example", "tiny", "latest", None),
        ("localhost/a/b/c", "localhost", "a/b/c", "latest", None),
        (f"r.example:443/x@{'sha256:' + 'a' * 64}", "r.example:443", "x", "latest",
         "sha256:" + "a" * 64),
    ],
)  # fmt: skip
def test_references(text: str, registry: str, repository: str, tag: str, digest: str) -> None:
    ref = parse_reference(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (
        registry,
        repository,
        tag,
        digest,
    )


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("tiny", "does not name a registry"),
        ("coldsnap/tiny:v1", "not a registry host"),
        ("r.example/Tiny", "lowercase"),
        ("r.example/x@sha256:abc", "not a digest"),
    ],
)
def test_references_refused(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_reference(text)


def test_docker_config_is_read_where_docker_reads_it() -> None:
    assert docker_configs({}) == []
    assert docker_configs({"DOCKER_CONFIG": "/etc/ci-docker"}) == ["/etc/ci-docker/config.json"]
