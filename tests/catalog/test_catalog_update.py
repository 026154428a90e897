"""update_prices: writing a refreshed catalog copy and reading it back."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from flow_sdk.catalog import (
    CatalogError,
    find_offers,
    load_catalog,
    update_prices,
    user_catalog_path,
)
from flow_sdk.spec import GpuSpec

H100 = GpuSpec.parse("h100:8")


def _prices(path: Path | None, name: str, region: str) -> tuple[float, float | None]:
    catalog = load_catalog(path)
    entry = next(e for e in catalog.entries if e.instance.name == name and e.region == region)
    return entry.on_demand_usd_per_hour, entry.spot_usd_per_hour


def test_update_prices_round_trip(tmp_path: Path) -> None:
    before = load_catalog()
    dest = tmp_path / "nested" / "aws_instances.csv"
    written = update_prices(
        {("p5.48xlarge", "us-east-1"): {"on-demand": 49.5, "spot": 21.75},
         ("g5.xlarge", "eu-west-1"): {"spot": None},
         ("g6.xlarge", "us-east-2"): {"on-demand": 0.79}},
        dest,
        source="AWS Price List API, test run",
        as_of=date(2027, 3, 4),
    )
    loaded = load_catalog(dest)
    assert loaded.entries == written.entries
    assert (loaded.as_of, loaded.source) == (date(2027, 3, 4), "AWS Price List API, test run")
    assert _prices(dest, "p5.48xlarge", "us-east-1") == (49.5, 21.75)
    g5_on_demand = _prices(None, "g5.xlarge", "eu-west-1")[0]
    assert _prices(dest, "g5.xlarge", "eu-west-1") == (g5_on_demand, None)
    old_spot = _prices(None, "g6.xlarge", "us-east-2")[1]
    assert _prices(dest, "g6.xlarge", "us-east-2") == (0.79, old_spot)
    changed = {("p5.48xlarge", "us-east-1"), ("g5.xlarge", "eu-west-1"), ("g6.xlarge", "us-east-2")}
    assert len(before.entries) == len(loaded.entries)
    for old, new in zip(before.entries, loaded.entries, strict=True):
        assert old.instance == new.instance and old.region == new.region
        if (old.instance.name, old.region) not in changed:
            assert old == new
    # The unit and refresh notes of the packaged file survive.
    notes = [c for c in before.comments if "units" in c or "refresh" in c]
    assert notes and [c for c in loaded.comments if c in notes] == notes
    # The packaged catalog is untouched.
    assert load_catalog().entries == before.entries


def test_refreshed_copy_in_flow_home_drives_lookups() -> None:
    update_prices({("p5.48xlarge", "us-west-2"): {"spot": 5.0}}, user_catalog_path(),
                  source="test", as_of=date(2027, 1, 1))
    cheapest = find_offers(H100)[0]
    assert (cheapest.region, cheapest.market, cheapest.usd_per_hour) == ("us-west-2", "spot", 5.0)
    assert load_catalog().as_of == date(2027, 1, 1)


def test_a_known_type_can_gain_a_region(tmp_path: Path) -> None:
    dest = tmp_path / "c.csv"
    update_prices({("p5.48xlarge", "eu-west-1"): {"on-demand": 60.0, "spot": 30.0}}, dest,
                  source="test")
    offers = find_offers(H100, regions=["eu-west-1"], catalog=load_catalog(dest))
    assert [(o.market, o.usd_per_hour) for o in offers] == [("spot", 30.0), ("on-demand", 60.0)]
    assert load_catalog(dest).as_of == date.today()


@pytest.mark.parametrize(
    ("update", "error", "match"),
    [
        ({("p9.96xlarge", "us-east-1"): {"on-demand": 1.0}}, CatalogError, "p9.96xlarge"),
        ({("p5.48xlarge", "eu-west-1"): {"spot": 1.0}}, ValueError, "needs an on-demand price"),
        ({("p5.48xlarge", "us-east-1"): {"on-demand": -3.0}}, ValueError, "positive"),
        ({("p5.48xlarge", "us-east-1"): {"on-demand": float("nan")}}, ValueError, "positive"),
        ({("p5.48xlarge", "us-east-1"): {"on-demand": None}}, ValueError, "cannot be None"),
        ({("p5.48xlarge", "us-east-1"): {"spot": 90.0}}, ValueError, "exceeds the on-demand"),
        ({("p5.48xlarge", "us-east-1"): {"reserved": 9.0}}, ValueError, "unknown market"),
        ({("p5.48xlarge", "mars-1"): {"on-demand": 9.0}}, ValueError, "region name"),
    ],
    ids=["unknown-type", "new-row-without-on-demand", "negative", "nan", "none-on-demand",
         "spot-above-on-demand", "unknown-market", "bad-region"],
)
def test_bad_updates_are_rejected_and_write_nothing(
    tmp_path: Path, update: dict[tuple[str, str], dict[str, float | None]],
    error: type[Exception], match: str,
) -> None:
    dest = tmp_path / "c.csv"
    with pytest.raises(error, match=match):
        update_prices(update, dest, source="test")
    assert not dest.exists()
    assert list(tmp_path.iterdir()) == []


def test_source_must_be_given(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="source"):
        update_prices({}, tmp_path / "c.csv", source="  ")


def test_update_replaces_an_existing_file(tmp_path: Path) -> None:
    dest = tmp_path / "c.csv"
    update_prices({("c7i.xlarge", "us-east-1"): {"on-demand": 0.2}}, dest, source="first")
    update_prices({("c7i.xlarge", "us-east-1"): {"on-demand": 0.3}}, dest, source="second",
                  base=load_catalog(dest))
    assert _prices(dest, "c7i.xlarge", "us-east-1")[0] == 0.3
    assert load_catalog(dest).source == "second"
    assert [p.name for p in tmp_path.iterdir()] == ["c.csv"]


def test_repricing_an_unknown_type_names_the_gpu_field(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="only reprices known types") as info:
        update_prices({("p9.96xlarge", "us-east-1"): {"on-demand": 1.0}}, tmp_path / "c.csv",
                      source="test")
    assert info.value.field == "gpu"
