"""The caller's SDK reaches the nodes by digest, and the nodes run the caller's Python."""

from __future__ import annotations

import hashlib

import pytest
from aws_moto_world import BUCKET, AwsWorld, Recorder, boot_of, launch, spec

from flow_sdk import FlowApp, ValidationError, wire
from flow_sdk.providers import sdkwheel
from flow_sdk.errors import LaunchWarning, ProviderError
from flow_sdk.providers.aws._config import DLAMI_PYTHON, AwsConfig


def test_launch_stores_the_wheel_by_digest_and_the_user_data_names_it(
        aws: AwsWorld, recorder: Recorder) -> None:
    provider = aws.provider(recorder)
    launch(provider, "code-1", spec(priority="high"))
    [sent] = recorder.run_instances
    code = boot_of(sent["UserData"]).provider_config["code"]
    assert code["key"] == wire.code_key(code["sha256"]) == f"code/{code['sha256']}.whl"
    assert code["python"] == sdkwheel.python_version()
    stored = aws.client("s3").get_object(Bucket=BUCKET, Key="flow/" + code["key"])
    data = stored["Body"].read()
    assert hashlib.sha256(data).hexdigest() == code["sha256"]
    sdkwheel.verify(data, code["sha256"])
    assert f"FLOW_CODE_URL=s3://{BUCKET}/flow/{code['key']}" in sent["UserData"]
    assert f"FLOW_CODE_SHA256={code['sha256']}" in sent["UserData"]
    assert f"FLOW_CODE_FILE={code['filename']}" in sent["UserData"]
    # a second task with the same SDK stores nothing new
    launch(provider, "code-2", spec(priority="high"))
    listed = aws.client("s3").list_objects_v2(Bucket=BUCKET, Prefix="flow/code/")
    assert [o["Key"] for o in listed["Contents"]] == ["flow/" + code["key"]]


def test_an_image_of_another_python_refuses_the_launch_and_warns_in_the_plan(
        aws: AwsWorld) -> None:
    mine = sdkwheel.python_version()
    provider = aws.provider(image_python="3.99")
    assert provider.check(spec(priority="high")) == []  # declaring and planning work
    problems = provider.launch_problems(spec(priority="high"))
    assert [p.field for p in problems] == ["provider_config"]
    assert f"runs Python 3.99, but this program runs Python {mine}" in problems[0].message
    assert "image_python" in problems[0].message
    assert provider.plan(spec(priority="high")).warnings == (problems[0].message,)
    app = FlowApp("py", provider="aws", provider_config=aws.config(image_python="3.99"))

    @app.function(priority="high", quiet=True)
    def train() -> None:
        return None

    with pytest.warns(LaunchWarning, match=f"Python 3.99, but this program runs Python {mine}"):
        assert app.plan(train).instance_type
    with pytest.raises(ValidationError, match="Python 3.99"):
        train.spawn()
    assert aws.instances() == []
    # a task image brings its own Python: its nodes refuse a mismatch at boot instead
    assert provider.launch_problems(spec(priority="high", image="python:3.12")) == []
    same = aws.provider(image_python=mine)
    assert same.launch_problems(spec(priority="high")) == []
    assert same.plan(spec(priority="high")).warnings == ()


def test_the_default_image_names_its_python_and_another_image_must(aws: AwsWorld) -> None:
    assert AwsConfig.from_mapping({"region": "us-east-1"}).node_python == DLAMI_PYTHON
    problems = aws.provider(image_python=None, ami_id="ami-12345678").launch_problems(
        spec(priority="high"))
    assert [p.field for p in problems] == ["provider_config"]
    assert "add image_python" in problems[0].message
    with pytest.raises(ProviderError, match="image_python"):
        AwsConfig.from_mapping({"region": "us-east-1", "image_python": "three"})


def test_node_config_carries_the_code_and_refuses_a_malformed_one() -> None:
    code = {"key": wire.code_key("a" * 64), "sha256": "a" * 64,
            "filename": sdkwheel.wheel_name("0.1.0"), "python": "3.12"}
    cfg = AwsConfig.from_mapping({"region": "us-east-1", "code": code})
    assert AwsConfig.from_mapping(cfg.to_dict()).to_dict()["code"] == code
    with pytest.raises(ProviderError, match="provider_config.code"):
        AwsConfig.from_mapping({"region": "us-east-1", "code": {**code, "sha256": "x"}})
