"""``flow catalog refresh``: new prices for the catalog's instance types, from AWS itself.

On-demand prices come from the AWS Price List API (``pricing:GetProducts``, served from
us-east-1); spot prices from each region's ``ec2:DescribeSpotPriceHistory`` (the cheapest
zone's latest price). The result is written through ``file.update_prices`` to the user's
catalog copy, which then overrides the packaged file. boto3 is imported by the caller.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from flow_sdk.catalog.file import load_catalog, update_prices, user_catalog_path
from flow_sdk.catalog.model import Catalog

PRICING_REGION = "us-east-1"
# The Price List filters that select Linux, shared-tenancy, on-demand capacity.
LINUX_SHARED = (
    ("operatingSystem", "Linux"),
    ("tenancy", "Shared"),
    ("preInstalledSw", "NA"),
    ("capacitystatus", "Used"),
    ("licenseModel", "No License required"),
)


@dataclass
class RefreshReport:
    on_demand: dict[tuple[str, str], float] = field(default_factory=dict)
    spot: dict[tuple[str, str], float] = field(default_factory=dict)
    missing: list[tuple[str, str]] = field(default_factory=list)  # no on-demand price found
    written_to: Path | None = None


def _on_demand_usd(product_json: str) -> float | None:
    """The hourly USD price in one Price List product document, or None if it has none."""
    product = json.loads(product_json)
    for term in product.get("terms", {}).get("OnDemand", {}).values():
        for dimension in term.get("priceDimensions", {}).values():
            usd = dimension.get("pricePerUnit", {}).get("USD")
            if usd is not None and dimension.get("unit", "Hrs") == "Hrs" and float(usd) > 0:
                return float(usd)
    return None


def fetch_on_demand(pricing: Any, pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], float]:
    """On-demand USD/hour per (instance type, region), Linux, shared tenancy."""
    prices: dict[tuple[str, str], float] = {}
    paginator = pricing.get_paginator("get_products")
    for instance_type, region in pairs:
        filters = [{"Type": "TERM_MATCH", "Field": "instanceType", "Value": instance_type},
                   {"Type": "TERM_MATCH", "Field": "regionCode", "Value": region}]
        filters += [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in LINUX_SHARED]
        for page in paginator.paginate(ServiceCode="AmazonEC2", Filters=filters):
            for document in page["PriceList"]:
                usd = _on_demand_usd(document)
                if usd is not None:
                    prices[(instance_type, region)] = usd
    return prices


def fetch_spot(ec2_for_region: Callable[[str], Any], pairs: Iterable[tuple[str, str]],
               now: datetime | None = None) -> dict[tuple[str, str], float]:
    """The cheapest zone's latest Linux spot price per (instance type, region)."""
    by_region: dict[str, list[str]] = {}
    for instance_type, region in pairs:
        by_region.setdefault(region, []).append(instance_type)
    start = now or datetime.now(timezone.utc)
    prices: dict[tuple[str, str], float] = {}
    for region, types in sorted(by_region.items()):
        latest: dict[tuple[str, str], tuple[datetime, float]] = {}
        paginator = ec2_for_region(region).get_paginator("describe_spot_price_history")
        for page in paginator.paginate(InstanceTypes=types, ProductDescriptions=["Linux/UNIX"],
                                       StartTime=start):
            for item in page["SpotPriceHistory"]:
                key = (item["InstanceType"], item["AvailabilityZone"])
                seen = latest.get(key)
                if seen is None or item["Timestamp"] > seen[0]:
                    latest[key] = (item["Timestamp"], float(item["SpotPrice"]))
        for (instance_type, _zone), (_ts, price) in latest.items():
            key = (instance_type, region)
            prices[key] = min(price, prices.get(key, price))
    return prices


def refresh_catalog(session: Any, *, regions: list[str] | None = None,
                    dest: Path | None = None, base: Catalog | None = None) -> RefreshReport:
    """Fetch current prices for every catalog row (in ``regions``) and write the user copy.

    A spot price above the new on-demand price is dropped (spot is then left as it was).
    """
    catalog = base if base is not None else load_catalog()
    wanted = sorted({(e.instance.name, e.region) for e in catalog.entries
                     if regions is None or e.region in regions})
    report = RefreshReport()
    report.on_demand = fetch_on_demand(session.client("pricing", region_name=PRICING_REGION),
                                       wanted)
    report.spot = fetch_spot(lambda r: session.client("ec2", region_name=r), wanted)
    report.missing = [pair for pair in wanted if pair not in report.on_demand]
    updates: dict[tuple[str, str], dict[str, float | None]] = {}
    for pair, usd in report.on_demand.items():
        updates[pair] = {"on-demand": usd}
        spot = report.spot.get(pair)
        if spot is not None and spot < usd:
            updates[pair]["spot"] = spot
    target = dest or user_catalog_path()
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    update_prices(updates, target, source=f"AWS Price List API and EC2 spot price history, "
                                          f"fetched {stamp}", base=catalog)
    report.written_to = target
    return report
