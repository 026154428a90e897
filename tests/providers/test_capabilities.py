"""What a provider honours, declared once (``Provider.capabilities``): an option it refuses is
a ``FieldProblem`` naming the provider and the field before anything launches (every such
option at once); one it runs without is a note shown with the plan; a new provider honours
none of them until it says so."""

from __future__ import annotations

import io
from typing import Any, ClassVar

import pytest

from flow_sdk.client.progress import Reporter, WatchOptions, show_plan
from flow_sdk.providers.aws import AwsProvider
from flow_sdk.providers.capabilities import OPTIONS, Capabilities, Support
from flow_sdk.providers.local import LocalProvider
from flow_sdk.spec import TaskSpec, build_task_spec


def _spec(**options: Any) -> TaskSpec:
    return build_task_spec(app="caps", name="t", **options)


EVERY_OPTION = dict(image="nvcr.io/nvidia/pytorch:24.01-py3", max_price_per_hour=9.0,
                    volumes={"/data": {"name": "d", "size_gb": 10}},
                    mounts={"/s3": "s3://bucket/prefix"}, internode_interconnect="efa")


class Bare(LocalProvider):
    """A provider that declares nothing (the default)."""

    name: ClassVar[str] = "bare"
    capabilities: ClassVar[Capabilities] = Capabilities()


def test_a_provider_that_declares_nothing_refuses_each_option_asked_naming_itself() -> None:
    problems = Bare().problems(_spec(**EVERY_OPTION))
    assert [p.field for p in problems] == ["image", "max_price_per_hour", "volumes", "mounts",
                                           "internode_interconnect"]
    assert all("the bare provider does not support" in p.message for p in problems)
    assert Bare().problems(_spec()) == []  # nothing optional asked: nothing refused


def test_aws_honours_every_option_and_local_notes_what_it_runs_without() -> None:
    assert all(AwsProvider.capabilities.support(name) is Support.HONOURED for name in OPTIONS)
    local = LocalProvider()
    spec = _spec(**EVERY_OPTION)
    assert [p for p in local.problems(spec) if "does not support" in p.message] == []
    notes = local.notes(spec)
    assert notes == ["local: image= is not used: the nodes run in this machine's Python "
                     "environment, not in a container",
                     "local: internode_interconnect= is not used: the nodes of this machine "
                     "talk over loopback"]
    assert local.notes(_spec()) == []
    out = io.StringIO()
    show_plan(local.plan(spec), Reporter(err=out), WatchOptions(confirm=False), notes=notes)
    assert f"note: {notes[0]}" in out.getvalue() and f"note: {notes[1]}" in out.getvalue()


def test_an_option_accepted_with_a_note_needs_its_note() -> None:
    with pytest.raises(ValueError, match="need exactly one note each"):
        Capabilities(image=Support.NOTED)
    with pytest.raises(ValueError, match="need exactly one note each"):
        Capabilities(notes={"image": "a note for an option that is refused"})
