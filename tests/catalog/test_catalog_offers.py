"""Offer lookup: matching, ordering, caps, priorities, EFA, regions and the errors."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from catalog_testing import cheapest_offers
from flow_sdk.catalog import (
    MARKETS,
    Offer,
    OfferNotFoundError,
    UnknownRegionError,
    explain_no_offers,
    find_offers,
    gpu_count_problem,
    load_catalog,
    markets_for_priority,
    plan_offers,
)
from flow_sdk.errors import FlowError
from flow_sdk.spec import GpuSpec, TaskSpec, build_task_spec


def gpu(text: str) -> GpuSpec:
    return GpuSpec.parse(text)


def task(**options: Any) -> TaskSpec:
    return build_task_spec(app="app", name="fn", **options)


def types(offers: list[Offer]) -> set[str]:
    return {o.instance_type for o in offers}


@pytest.mark.parametrize(
    ("request_text", "expected"),
    [
        ("h100:8", {"p5.48xlarge"}),
        ("a100-80gb:8", {"p4de.24xlarge"}),
        ("a100:8", {"p4d.24xlarge"}),
        ("h200:8", {"p5e.48xlarge", "p5en.48xlarge"}),
        ("b200:8", {"p6-b200.48xlarge"}),
        ("a10g", {"g5.xlarge", "g5.2xlarge"}),
        ("a10g:4", {"g5.12xlarge"}),
        ("l4:8", {"g6.48xlarge"}),
        ("l40s:4", {"g6e.12xlarge"}),
        ("t4:8", {"g4dn.metal"}),
        ("v100:8", {"p3.16xlarge"}),
        ("v100-32gb:8", {"p3dn.24xlarge"}),
    ],
)
def test_gpu_requests_match_exactly_the_right_types(request_text: str, expected: set[str]) -> None:
    assert types(find_offers(gpu(request_text))) == expected


def test_h100_8_is_a_p5() -> None:
    offers = find_offers(gpu("h100:8"), markets=("on-demand",), regions=["us-east-1"])
    assert [o.instance_type for o in offers] == ["p5.48xlarge"]
    assert offers[0].gpu_model == "h100" and offers[0].gpu_count == 8
    assert offers[0].usd_per_gpu_hour == pytest.approx(offers[0].usd_per_hour / 8)


def test_count_must_equal_the_instance_gpu_count() -> None:
    assert find_offers(gpu("h100:4")) == []
    assert find_offers(gpu("a10g:2")) == []
    with pytest.raises(OfferNotFoundError, match=r"exactly 4x h100.*p5\.48xlarge.*gpu='h100:8'"):
        plan_offers(task(gpu="h100:4"))


@pytest.mark.parametrize(("request_text", "words", "ask"), [
    ("h100:9", "9 h100 GPUs: the largest sold with h100 GPUs has 8", "gpu='h100:8'"),
    # no h100 PCIe machine at all: the model's largest
    ("h100.pcie:16", "16 h100 GPUs: the largest sold with h100 GPUs has 8", "gpu='h100:8'"),
    # the user's memory kept
    ("a100-80gb:12", "12 a100 GPUs: the largest sold with a100 GPUs has 8",
     "gpu='a100-80gb:8'"),
    ("a100:9", "9 a100 GPUs: the largest sold with a100 GPUs has 8", "gpu='a100:8'"),
    ("t4:9", "9 t4 GPUs: the largest sold with t4 GPUs has 8", "gpu='t4:8'"),
])
def test_a_count_above_the_models_largest_machine_names_it(request_text: str, words: str,
                                                            ask: str) -> None:
    problem = gpu_count_problem(gpu(request_text))
    assert problem is not None
    assert problem.startswith(f"no machine has {words} ("), problem
    assert f"Ask for {ask}, and more nodes (num_instances)" in problem
    with pytest.raises(OfferNotFoundError) as info:  # the aws provider's words are the same
        plan_offers(task(gpu=request_text))
    assert (info.value.field, str(info.value)) == ("gpu", problem)


@pytest.mark.parametrize("request_text", ["h100:8", "h100:4", "a10g:1", "any:9", "any:16"])
def test_a_count_some_machine_has_or_a_model_less_ask_is_not_a_count_problem(
        request_text: str) -> None:
    assert gpu_count_problem(gpu(request_text)) is None
    assert gpu_count_problem(None) is None


def test_a_model_the_catalog_does_not_sell_is_no_count_problem() -> None:
    catalog = load_catalog()
    without_h100 = dataclasses.replace(catalog, entries=tuple(
        e for e in catalog.entries if e.instance.gpu_model != "h100"))
    assert gpu_count_problem(gpu("h100:9"), without_h100) is None
    assert gpu_count_problem(gpu("a10g:9"), without_h100) is not None


def test_form_factor_must_match() -> None:
    assert find_offers(gpu("h100.pcie:8")) == []
    with pytest.raises(OfferNotFoundError, match=r"h100-80gb\.pcie.*8x h100-80gb\.sxm"):
        plan_offers(task(gpu="h100.pcie:8"))


def test_cpu_nodes_get_cpu_only_types() -> None:
    offers = find_offers(None)
    assert types(offers) == {"c7i.xlarge", "c7i.4xlarge", "m7i.2xlarge"}
    assert offers[0].instance_type == "c7i.xlarge"
    assert types(find_offers(None, min_vcpus=16)) == {"c7i.4xlarge"}
    assert types(find_offers(None, min_memory_gib=32)) == {"c7i.4xlarge", "m7i.2xlarge"}
    with pytest.raises(OfferNotFoundError, match="min_vcpus"):
        raise explain_no_offers(None, min_vcpus=10_000)


def test_offers_are_sorted_by_price_with_a_stable_tiebreak() -> None:
    offers = find_offers(gpu("a10g:4"))
    prices = [o.usd_per_hour for o in offers]
    assert prices == sorted(prices)
    keys = [(o.usd_per_hour, o.region, o.instance_type, MARKETS.index(o.market)) for o in offers]
    assert keys == sorted(keys)
    # Equal on-demand prices in the three US regions: alphabetical region order breaks the tie.
    on_demand = [o for o in offers if o.market == "on-demand"]
    assert [o.region for o in on_demand] == ["us-east-1", "us-east-2", "us-west-2", "eu-west-1"]
    assert find_offers(gpu("a10g:4")) == offers


def test_the_order_of_regions_asked_for_breaks_price_ties() -> None:
    offers = find_offers(gpu("h100:8"), markets=("on-demand",),
                         regions=["us-west-2", "us-east-1"])
    assert [o.region for o in offers] == ["us-west-2", "us-east-1"]


def test_spot_offers_use_the_spot_price_and_skip_types_without_spot() -> None:
    catalog = load_catalog()
    for offer in find_offers(gpu("h100:8"), markets=("spot",)):
        entry = next(e for e in catalog.entries
                     if e.instance.name == offer.instance_type and e.region == offer.region)
        assert offer.usd_per_hour == entry.spot_usd_per_hour
    assert find_offers(gpu("b200:8"), markets=("spot",)) == []
    assert find_offers(gpu("b200:8"), markets=("on-demand",))


def test_price_cap_is_inclusive_and_per_instance() -> None:
    cheapest = cheapest_offers(gpu("h100:8"), n=1)[0]
    capped = find_offers(gpu("h100:8"), max_price_per_hour=cheapest.usd_per_hour)
    assert capped and all(o.usd_per_hour <= cheapest.usd_per_hour for o in capped)
    assert find_offers(gpu("h100:8"), max_price_per_hour=cheapest.usd_per_hour - 0.01) == []


def test_a_cap_below_the_cheapest_lists_the_cheapest_offers() -> None:
    spec = task(gpu="h100:8", max_price_per_hour=10.0)
    with pytest.raises(OfferNotFoundError) as info:
        plan_offers(spec)
    error = info.value
    assert isinstance(error, FlowError) and isinstance(error, LookupError)
    expected = cheapest_offers(gpu("h100:8"), n=3, markets=markets_for_priority("med"))
    assert list(error.cheapest) == expected
    assert error.max_price_per_hour == 10.0
    message = str(error)
    assert "max_price_per_hour" in message and "$10.00" in message
    for offer in expected:
        assert f"{offer.region} at ${offer.usd_per_hour:,.2f}/h" in message
    assert f"at least ${expected[0].usd_per_hour:,.2f}" in message


def test_a_cap_on_on_demand_suggests_spot_when_spot_fits() -> None:
    with pytest.raises(OfferNotFoundError, match=r"allow spot with priority='med' or 'low'"):
        plan_offers(task(gpu="h100:8", priority="high", max_price_per_hour=40.0))


def test_priority_maps_to_markets() -> None:
    assert markets_for_priority("low") == ("spot",)
    assert markets_for_priority("med") == ("spot", "on-demand")
    assert markets_for_priority("high") == ("on-demand",)
    with pytest.raises(ValueError, match="priority must be one of"):
        markets_for_priority("urgent")


@pytest.mark.parametrize("priority", ["low", "med", "high"])
def test_plan_orders_by_market_preference_then_price(priority: str) -> None:
    markets = markets_for_priority(priority)
    plan = plan_offers(task(gpu="a10g:4", priority=priority))
    assert {o.market for o in plan} == set(markets)
    assert [markets.index(o.market) for o in plan] == sorted(markets.index(o.market) for o in plan)
    for market in markets:
        prices = [o.usd_per_hour for o in plan if o.market == market]
        assert prices == sorted(prices)
    assert len(plan) == len(find_offers(gpu("a10g:4"), markets=markets))


def test_med_priority_falls_back_to_on_demand_after_every_spot_offer() -> None:
    plan = plan_offers(task(gpu="h100:8", priority="med"))
    first_on_demand = [o.market for o in plan].index("on-demand")
    assert all(o.market == "spot" for o in plan[:first_on_demand])
    assert plan[first_on_demand].usd_per_hour > plan[first_on_demand - 1].usd_per_hour


def test_low_priority_without_spot_names_the_fix() -> None:
    with pytest.raises(OfferNotFoundError, match=r"not sold as spot.*priority='med'"):
        plan_offers(task(gpu="b200:8", priority="low"))


def test_efa_filter() -> None:
    all_a10g = find_offers(gpu("a10g:4"))
    with_efa = find_offers(gpu("a10g:4"), require_efa=True)
    assert with_efa == all_a10g
    assert find_offers(gpu("a10g:1"), require_efa=True) == []
    assert find_offers(None, require_efa=True) == []
    plan = plan_offers(task(gpu="a10g:4", internode_interconnect="efa"))
    assert all(o.efa_supported for o in plan)
    with pytest.raises(OfferNotFoundError, match=r"supports EFA.*internode_interconnect='efa'"):
        plan_offers(task(gpu="a10g", internode_interconnect="efa"))
    assert plan_offers(task(gpu="a10g", internode_interconnect="ethernet"))


def test_infiniband_is_served_by_efa_on_aws() -> None:
    plan = plan_offers(task(gpu="h100:8", internode_interconnect="InfiniBand"))
    assert plan and all(o.efa_supported for o in plan)
    with pytest.raises(OfferNotFoundError, match="EFA"):
        plan_offers(task(gpu="a10g", internode_interconnect="infiniband"))


def test_unknown_region_is_a_clear_error() -> None:
    with pytest.raises(UnknownRegionError) as info:
        find_offers(gpu("h100:8"), regions=["us-east1"])
    message = str(info.value)
    assert "'us-east1'" in message and "did you mean 'us-east-1'" in message
    assert "us-west-2" in message and "flow catalog refresh" in message
    assert isinstance(info.value, FlowError) and isinstance(info.value, ValueError)
    with pytest.raises(UnknownRegionError, match="ap-south-1"):
        plan_offers(task(gpu="h100:8", region="ap-south-1"))
    with pytest.raises(ValueError, match="regions is empty"):
        find_offers(gpu("h100:8"), regions=[])
    with pytest.raises(TypeError, match="list of region names"):
        find_offers(gpu("h100:8"), regions="us-east-1")


def test_bad_markets_are_rejected() -> None:
    with pytest.raises(ValueError, match="market must be"):
        find_offers(gpu("h100:8"), markets=("reserved",))
    with pytest.raises(TypeError):
        find_offers(gpu("h100:8"), markets="spot")


def test_spec_region_wins_over_the_provider_default_regions() -> None:
    plan = plan_offers(task(gpu="a10g:4", region="eu-west-1"), regions=["us-east-1"])
    assert {o.region for o in plan} == {"eu-west-1"}
    plan = plan_offers(task(gpu="a10g:4"), regions=["us-east-1", "us-west-2"])
    assert {o.region for o in plan} == {"us-east-1", "us-west-2"}


def test_a_type_missing_from_the_region_names_where_it_is_sold() -> None:
    with pytest.raises(OfferNotFoundError, match=r"offered in us-east-1, us-east-2, us-west-2"):
        plan_offers(task(gpu="h200:8", region="eu-west-1"))


def test_explain_refuses_a_request_that_has_offers() -> None:
    with pytest.raises(ValueError, match="offers exist"):
        explain_no_offers(gpu("h100:8"))


def test_offer_text_names_type_market_region_and_price() -> None:
    offer = find_offers(gpu("h100:8"), markets=("on-demand",), regions=["us-east-1"])[0]
    assert str(offer) == ("p5.48xlarge (8x h100-80gb.sxm) on-demand in us-east-1 at "
                          f"${offer.usd_per_hour:,.2f}/h")


def test_explain_refuses_a_capped_request_that_has_offers() -> None:
    with pytest.raises(ValueError, match="offers exist"):
        explain_no_offers(gpu("h100:8"), max_price_per_hour=1000.0)


@pytest.mark.parametrize(("options", "field", "text"), [
    ({"gpu": "h100:4"}, "gpu", "exactly 4x h100"),
    ({"gpu": "h100.pcie:8"}, "gpu", "h100-80gb.pcie"),
    ({"gpu": "h200:8", "region": "eu-west-1"}, "region", "Set region"),
    ({"gpu": "a10g", "internode_interconnect": "efa"}, "internode_interconnect", "EFA"),
    ({"gpu": "a10g", "internode_interconnect": "infiniband"}, "internode_interconnect", "EFA"),
    ({"gpu": "b200:8", "priority": "low"}, "priority", "not sold as spot"),
    ({"gpu": "h100:8", "max_price_per_hour": 10.0}, "max_price_per_hour", "$10.00"),
    ({"gpu": "h100:8", "priority": "high", "max_price_per_hour": 40.0},
     "max_price_per_hour", "allow spot"),
])
def test_the_offer_error_carries_the_field_that_ruled_everything_out(
        options: dict[str, Any], field: str, text: str) -> None:
    with pytest.raises(OfferNotFoundError) as info:
        plan_offers(task(**options))
    assert info.value.field == field
    assert text in str(info.value)


def test_explain_names_gpu_for_a_cpu_request_no_type_satisfies() -> None:
    assert explain_no_offers(None, min_vcpus=10_000).field == "gpu"


def test_an_unknown_region_names_where_it_was_asked_for() -> None:
    with pytest.raises(UnknownRegionError) as info:
        plan_offers(task(gpu="h100:8", region="ap-south-1"))
    assert info.value.field == "region"
    with pytest.raises(UnknownRegionError) as info:
        plan_offers(task(gpu="h100:8"), regions=["us-east-1", "ap-south-1"])
    assert info.value.field == "provider_config" and info.value.region == "ap-south-1"
    with pytest.raises(UnknownRegionError) as info:
        find_offers(gpu("h100:8"), regions=["us-east1"])
    assert info.value.field == "region"
    with pytest.raises(UnknownRegionError) as info:
        load_catalog().check_regions(["mars-north-1"], field="provider_config")
    assert info.value.field == "provider_config"
