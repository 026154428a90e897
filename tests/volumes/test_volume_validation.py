"""Bad volume and mount input is rejected when the function is declared (or the volume made),
naming the field, and nothing is created: no volume directory, no task, no process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from volumes_helpers import flow_processes

from flow_sdk import FlowApp, ValidationError
from flow_sdk.volumes import Volume, create_volume, delete_volume

app = FlowApp("bad-volumes")
GOOD = {"name": "ckpt", "size_gb": 10, "interface": "file"}


def _fn() -> None:
    return None


def _assert_nothing_created(home: Path) -> None:
    assert not (home / "local" / "volumes").exists()
    assert not (home / "local" / "store" / "tasks").exists()
    assert not (home / "local" / "instances").exists()
    assert not (home / "local" / "cache").exists()
    assert flow_processes(home) == []


CASES: list[tuple[str, dict[str, Any], str, str]] = [
    # id, options, field, message fragment
    ("relative-volume-path", {"volumes": {"shared/ckpt": GOOD}}, "volumes",
     "must be absolute"),
    ("relative-mount-path", {"mounts": {"data": "s3://bucket/p"}}, "mounts", "must be absolute"),
    ("dotdot-volume-path", {"volumes": {"/shared/../ckpt": GOOD}}, "volumes",
     "must not contain '..'"),
    ("dotdot-mount-path", {"mounts": {"/data/..": "s3://bucket/p"}}, "mounts",
     "must not contain '..'"),
    ("dotdot-s3-uri", {"mounts": {"/data": "s3://bucket/a/../b"}}, "mounts",
     "must not contain '..'"),
    ("not-normalized", {"volumes": {"/shared//ckpt": GOOD}}, "volumes", "is not normalized"),
    ("root", {"volumes": {"/": GOOD}}, "volumes", "system directory"),
    ("etc", {"volumes": {"/etc/ckpt": GOOD}}, "volumes", "system directory"),
    ("usr", {"mounts": {"/usr": "s3://bucket/p"}}, "mounts", "system directory"),
    ("proc", {"volumes": {"/proc/x": GOOD}}, "volumes", "system directory"),
    ("tmp-exact", {"mounts": {"/tmp": "s3://bucket/p"}}, "mounts", "system directory"),
    ("home-exact", {"volumes": {"/home": GOOD}}, "volumes", "system directory"),
    ("nested-volumes", {"volumes": {"/shared": GOOD, "/shared/ckpt": {"name": "other"}}},
     "volumes", "overlap"),
    ("volume-over-mount", {"volumes": {"/data": GOOD}, "mounts": {"/data/x": "s3://bucket/p"}},
     "mounts", "overlap"),
    ("same-path-twice", {"volumes": {"/data": GOOD}, "mounts": {"/data": "s3://bucket/p"}},
     "volumes", "overlap"),
    # "/a-b" sorts between "/a" and "/a/b": every pair is compared, not neighbours only.
    ("nested-apart-in-sort-order", {"volumes": {"/a": GOOD, "/a-b": {"name": "other"}},
                                    "mounts": {"/a/b": "s3://bucket/p"}}, "mounts", "overlap"),
    ("name-uppercase", {"volumes": {"/shared/ckpt": {"name": "Ckpt"}}},
     "volumes./shared/ckpt.name", "must be 1-63 characters"),
    ("name-space", {"volumes": {"/shared/ckpt": {"name": "my ckpt"}}},
     "volumes./shared/ckpt.name", "must be 1-63 characters"),
    ("name-dotdot", {"volumes": {"/shared/ckpt": {"name": ".."}}},
     "volumes./shared/ckpt.name", "must be 1-63 characters"),
    ("name-slash", {"volumes": {"/shared/ckpt": {"name": "a/b"}}},
     "volumes./shared/ckpt.name", "must be 1-63 characters"),
    ("name-leading-dash", {"volumes": {"/shared/ckpt": {"name": "-x"}}},
     "volumes./shared/ckpt.name", "must be 1-63 characters"),
    ("name-empty", {"volumes": {"/shared/ckpt": ""}}, "volumes./shared/ckpt.name",
     "must be 1-63 characters"),
    ("name-too-long", {"volumes": {"/shared/ckpt": {"name": "a" * 64}}},
     "volumes./shared/ckpt.name", "must be 1-63 characters"),
    ("same-volume-twice", {"volumes": {"/a": GOOD, "/b": GOOD}}, "volumes", "mount each volume once"),
    ("block-multi-node", {"num_instances": 2,
                          "volumes": {"/shared/ckpt": {"name": "ckpt", "interface": "block"}}},
     "volumes", "use interface='file'"),
    ("block-too-big", {"volumes": {"/d": {"name": "d", "interface": "block", "size_gb": 20000}}},
     "volumes./d", "at most 16384 GB"),
    ("bad-interface", {"volumes": {"/d": {"name": "d", "interface": "nfs"}}},
     "volumes./d.interface", "'file' or 'block'"),
    ("zero-size", {"volumes": {"/d": {"name": "d", "size_gb": 0}}}, "volumes./d.size_gb",
     "greater than or equal to 1"),
    ("not-s3", {"mounts": {"/data": "http://bucket/p"}}, "mounts", "must be an S3 URI"),
    ("s3-no-bucket", {"mounts": {"/data": "s3://"}}, "mounts", "must be an S3 URI"),
    ("s3-bad-bucket", {"mounts": {"/data": "s3://Bad_Bucket/p"}}, "mounts", "must be an S3 URI"),
]


@pytest.mark.parametrize(("options", "field", "fragment"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_volume_or_mount_is_rejected_at_decoration(flow_home: Path, options: dict[str, Any],
                                                       field: str, fragment: str) -> None:
    with pytest.raises(ValidationError) as info:
        app.function(**options)(_fn)
    assert field in info.value.fields, info.value
    assert fragment in str(info.value), info.value
    _assert_nothing_created(flow_home)


@pytest.mark.parametrize(("options", "field", "fragment"), [c[1:] for c in CASES[:6]],
                         ids=[c[0] for c in CASES[:6]])
def test_bad_options_are_rejected_by_with_options_too(flow_home: Path, options: dict[str, Any],
                                                      field: str, fragment: str) -> None:
    good = app.function(num_instances=1)(_fn)
    with pytest.raises(ValidationError) as info:
        good.with_options(**options)
    assert field in info.value.fields and fragment in str(info.value)
    _assert_nothing_created(flow_home)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"name": "Bad Name"}, "volume.name"),
    ({"name": "../escape"}, "volume.name"),
    ({"name": "ok", "size_gb": 0}, "volume.size_gb"),
    ({"name": "ok", "interface": "nfs"}, "volume.interface"),
    ({"name": "ok", "interface": "block", "size_gb": 99999}, "volume.size_gb"),
])
def test_bad_volume_objects_and_cli_input_create_nothing(flow_home: Path, kwargs: dict[str, Any],
                                                         field: str) -> None:
    with pytest.raises(ValidationError) as info:
        create_volume(**kwargs)
    assert field in info.value.fields, info.value
    with pytest.raises(ValidationError):
        Volume(**kwargs)
    _assert_nothing_created(flow_home)


def test_bad_names_are_rejected_by_delete_and_unknown_provider(flow_home: Path) -> None:
    with pytest.raises(ValidationError, match="must be 1-63 characters"):
        delete_volume("../../etc")
    with pytest.raises(ValidationError, match="unknown provider"):
        create_volume("ok", provider="nope")
    _assert_nothing_created(flow_home)


def test_good_shorthands_are_accepted(flow_home: Path) -> None:
    fn = app.function(volumes={"/shared/ckpt": "ckpt", "/scratch": Volume("scratch", 5)},
                      mounts={"/data": "s3://bucket/prefix"})(_fn)
    assert fn.spec.volumes["/shared/ckpt"].name == "ckpt"
    assert fn.spec.volumes["/scratch"].size_gb == 5
    assert fn.spec.mounts == {"/data": "s3://bucket/prefix"}
    _assert_nothing_created(flow_home)  # declaring creates nothing either
