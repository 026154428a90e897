"""Catalog refresh: the Pricing API through botocore's Stubber (moto has no Pricing API),
spot prices through moto's EC2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from flow_sdk.catalog import (
    LINUX_SHARED,
    fetch_on_demand,
    find_offers,
    load_catalog,
    refresh_catalog,
)
from flow_sdk.spec import GpuSpec


def _product(usd: str) -> str:
    return json.dumps({"terms": {"OnDemand": {"T1": {"priceDimensions": {
        "D1": {"unit": "Hrs", "pricePerUnit": {"USD": usd}}}}}}})


def _filters(instance_type: str, region: str) -> list[dict[str, str]]:
    return ([{"Type": "TERM_MATCH", "Field": "instanceType", "Value": instance_type},
             {"Type": "TERM_MATCH", "Field": "regionCode", "Value": region}]
            + [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in LINUX_SHARED])


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)


def test_fetch_on_demand_reads_the_price_list_documents(aws_env: None) -> None:
    pricing = boto3.client("pricing", region_name="us-east-1")
    with Stubber(pricing) as stub:
        stub.add_response("get_products", {"PriceList": [_product("55.04")], "FormatVersion": "aws_v1"},
                          {"ServiceCode": "AmazonEC2", "Filters": _filters("p5.48xlarge", "us-east-1")})
        stub.add_response("get_products", {"PriceList": [], "FormatVersion": "aws_v1"},
                          {"ServiceCode": "AmazonEC2", "Filters": _filters("g5.xlarge", "us-west-2")})
        prices = fetch_on_demand(pricing, [("p5.48xlarge", "us-east-1"), ("g5.xlarge", "us-west-2")])
        stub.assert_no_pending_responses()
    assert prices == {("p5.48xlarge", "us-east-1"): 55.04}


def test_refresh_writes_a_user_catalog_that_overrides_the_packaged_one(aws_env: None) -> None:
    catalog = load_catalog()
    wanted = sorted({(e.instance.name, e.region) for e in catalog.entries
                     if e.region == "us-east-1"})
    session = boto3.Session(region_name="us-east-1")
    pricing = session.client("pricing", region_name="us-east-1")
    with mock_aws(), Stubber(pricing) as stub:
        for instance_type, region in wanted:
            usd = "31.4159" if instance_type == "p5.48xlarge" else "1000.0"
            stub.add_response("get_products", {"PriceList": [_product(usd)], "FormatVersion": "v"},
                              {"ServiceCode": "AmazonEC2", "Filters": _filters(instance_type, region)})

        class Session:
            def client(self, name: str, region_name: str) -> object:
                return pricing if name == "pricing" else session.client(name, region_name=region_name)

        report = refresh_catalog(Session(), regions=["us-east-1"])
        stub.assert_no_pending_responses()
    assert report.written_to == Path(os.environ["FLOW_HOME"]) / "catalog" / "aws_instances.csv"
    assert report.missing == []
    assert report.spot  # moto's spot price history answered for every type
    offer = find_offers(GpuSpec.parse("h100:8"), regions=["us-east-1"], markets=("on-demand",),
                        catalog=load_catalog())[0]
    assert (offer.instance_type, offer.usd_per_hour) == ("p5.48xlarge", 31.4159)
    assert "AWS Price List API" in load_catalog().source


def test_cli_catalog_refresh_writes_the_user_catalog(aws_env: None,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from flow_sdk.cli import main

    wanted = sorted({(e.instance.name, e.region) for e in load_catalog().entries
                     if e.region == "eu-west-1"})
    real = boto3.Session(region_name="us-east-1")
    pricing = real.client("pricing", region_name="us-east-1")

    class Session:
        """The real session, with the stubbed pricing client (moto, when a test runs alone,
        asks a new Session for the regions it serves)."""

        def client(self, name: str, region_name: str) -> object:
            return pricing if name == "pricing" else real.client(name, region_name=region_name)

        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

    monkeypatch.setattr(boto3, "Session", lambda: Session())
    with mock_aws(), Stubber(pricing) as stub:
        for instance_type, region in wanted:
            stub.add_response("get_products", {"PriceList": [_product("2000.0")],
                                               "FormatVersion": "v"},
                              {"ServiceCode": "AmazonEC2", "Filters": _filters(instance_type, region)})
        result = CliRunner().invoke(main, ["catalog", "refresh", "--region", "eu-west-1", "--json"])
        stub.assert_no_pending_responses()
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["on_demand_prices"] == len(wanted) and data["missing"] == []
    assert Path(data["written_to"]) == Path(os.environ["FLOW_HOME"]) / "catalog" / "aws_instances.csv"
