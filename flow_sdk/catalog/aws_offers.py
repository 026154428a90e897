"""AWS offer lookup: the ONE place that turns a GPU request into priced offers.

Offers come from the catalog (``catalog/file.py`` loads it, ``catalog/model.py`` defines it).

Matching rules (used by :func:`find_offers` and everything built on it):

* A GPU request matches an instance type whose GPUs have the same model, the same memory per GPU
  and the same form factor, and whose GPU count EQUALS the requested count. A larger machine is
  never substituted: one worker runs per requested GPU, so extra GPUs would sit idle and be billed.
* ``gpu=None`` (a CPU node) matches only instance types without GPUs.
* ``max_price_per_hour`` is per instance-hour and compared with the offer's price (inclusive).

Priority picks the markets and their order (:func:`markets_for_priority`)::

    low  -> ("spot",)               cheapest; may be interrupted
    med  -> ("spot", "on-demand")   spot first, on-demand when spot has no capacity
    high -> ("on-demand",)          never interrupted

:func:`plan_offers` returns the candidates for one launch in the order a provider should try
them: market preference for the priority, then price, then the region order asked for, then the
instance type name. Providers try each offer's availability zones before moving down the list.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Protocol

from flow_sdk.catalog.file import load_catalog
from flow_sdk.catalog.gpus import find_gpu_model
from flow_sdk.catalog.model import (
    MARKETS,
    Catalog,
    GpuRequest,
    InstanceType,
    Market,
    Offer,
    OfferNotFoundError,
)

PRIORITY_MARKETS: Mapping[str, tuple[Market, ...]] = MappingProxyType({
    "low": ("spot",),
    "med": ("spot", "on-demand"),
    "high": ("on-demand",),
})


class OfferRequest(Protocol):
    """What :func:`plan_offers` needs from a task; :class:`flow_sdk.spec.TaskSpec` satisfies it."""

    @property
    def gpu(self) -> GpuRequest | None: ...

    @property
    def max_price_per_hour(self) -> float | None: ...

    @property
    def priority(self) -> str: ...

    @property
    def internode_interconnect(self) -> str | None: ...

    @property
    def region(self) -> str | None: ...


def markets_for_priority(priority: str) -> tuple[Market, ...]:
    """The markets a priority may use, most preferred first (see the module docstring)."""
    try:
        return PRIORITY_MARKETS[priority]
    except KeyError:
        raise ValueError(f"priority must be one of {list(PRIORITY_MARKETS)}, "
                         f"got {priority!r}") from None


def _check_markets(markets: Iterable[str]) -> tuple[Market, ...]:
    if isinstance(markets, str):
        raise TypeError(f"markets must be a sequence such as ('spot',), "
                        f"not the string {markets!r}")
    by_name: dict[str, Market] = {m: m for m in MARKETS}
    result: list[Market] = []
    for name in markets:
        market = by_name.get(name)
        if market is None:
            raise ValueError(f"market must be 'on-demand' or 'spot', got {name!r}")
        if market not in result:
            result.append(market)
    if not result:
        raise ValueError("markets is empty; pass ('on-demand',), ('spot',) or both")
    return tuple(result)


def _region_order(cat: Catalog, regions: Sequence[str] | None, *,
                  field: str) -> tuple[str, ...]:
    """``regions`` checked against the catalog (every catalog region for None); an unknown
    one raises UnknownRegionError naming ``field``."""
    if regions is None:
        return cat.regions
    if isinstance(regions, str):
        raise TypeError(f"regions must be a list of region names, not the string {regions!r}")
    if not regions:
        raise ValueError("regions is empty; pass None to search every catalog region")
    return cat.check_regions(regions, field=field)


def _describe(gpu: GpuRequest | None) -> str:
    if gpu is None:
        return "a CPU-only instance"
    return f"{gpu.count}x {gpu.model}-{gpu.memory_gb}gb.{gpu.form_factor}"


def _hardware_ok(instance: InstanceType, gpu: GpuRequest | None, min_vcpus: int | None,
                 min_memory_gib: float | None) -> bool:
    return (instance.matches(gpu)
            and (min_vcpus is None or instance.vcpus >= min_vcpus)
            and (min_memory_gib is None or instance.memory_gib >= min_memory_gib))


def _sorted(offers: Iterable[Offer], region_order: Sequence[str],
            markets: Sequence[Market]) -> list[Offer]:
    rank = {region: i for i, region in enumerate(region_order)}
    return sorted(offers, key=lambda o: (o.usd_per_hour, rank[o.region], o.instance_type,
                                         markets.index(o.market)))


def find_offers(
    gpu: GpuRequest | None,
    *,
    regions: Sequence[str] | None = None,
    markets: Sequence[str] = MARKETS,
    max_price_per_hour: float | None = None,
    require_efa: bool = False,
    min_vcpus: int | None = None,
    min_memory_gib: float | None = None,
    catalog: Catalog | None = None,
) -> list[Offer]:
    """Every offer matching the request, cheapest first.

    Ties break on the order of ``regions`` (alphabetical when None = all regions), then the
    instance type name, then the order of ``markets``. Raises UnknownRegionError for a region
    the catalog lacks; returns an empty list when nothing matches.
    """
    cat = catalog if catalog is not None else load_catalog()
    region_order = _region_order(cat, regions, field="region")
    wanted_markets = _check_markets(markets)
    wanted_regions = set(region_order)
    found = (
        offer
        for offer in cat.offers()
        if offer.region in wanted_regions
        and offer.market in wanted_markets
        and (max_price_per_hour is None or offer.usd_per_hour <= max_price_per_hour)
        and (not require_efa or offer.efa_supported)
        and _hardware_ok(offer.instance, gpu, min_vcpus, min_memory_gib)
    )
    return _sorted(found, region_order, wanted_markets)


def explain_no_offers(
    gpu: GpuRequest | None,
    *,
    regions: Sequence[str] | None = None,
    markets: Sequence[str] = MARKETS,
    max_price_per_hour: float | None = None,
    require_efa: bool = False,
    min_vcpus: int | None = None,
    min_memory_gib: float | None = None,
    catalog: Catalog | None = None,
) -> OfferNotFoundError:
    """The error for a request that :func:`find_offers` answers with nothing: which condition
    ruled every offer out, what the catalog does have, and what to change."""
    cat = catalog if catalog is not None else load_catalog()
    what = _describe(gpu)
    region_order = _region_order(cat, regions, field="region")
    wanted_markets = _check_markets(markets)
    hardware = [e for e in cat.entries if _hardware_ok(e.instance, gpu, min_vcpus, min_memory_gib)]
    if not hardware:
        return OfferNotFoundError(_no_hardware_message(cat, gpu, what, min_vcpus, min_memory_gib),
                                  field="gpu", request=what)
    in_regions = [e for e in hardware if e.region in region_order]
    if not in_regions:
        offered = sorted({e.region for e in hardware})
        return OfferNotFoundError(
            f"no instance type with {what} is offered in {', '.join(region_order)}; it is offered "
            f"in {', '.join(offered)}. Set region to one of these (or leave it unset)",
            field="region", request=what)
    with_efa = [e for e in in_regions if e.instance.efa_supported or not require_efa]
    if not with_efa:
        names = sorted({e.instance.name for e in in_regions})
        return OfferNotFoundError(
            f"no instance type with {what} in {', '.join(region_order)} supports EFA "
            f"({', '.join(names)} do not); drop internode_interconnect='efa' to use ethernet, "
            "or pick a GPU whose instance types have EFA",
            field="internode_interconnect", request=what)
    uncapped = find_offers(gpu, regions=region_order, markets=wanted_markets,
                           require_efa=require_efa, min_vcpus=min_vcpus,
                           min_memory_gib=min_memory_gib, catalog=cat)
    if not uncapped:
        sold = [m for m in MARKETS if any(e.price(m) is not None for e in with_efa)]
        fix = ("use priority='med' (spot, then on-demand) or 'high' (on-demand)"
               if "on-demand" in sold else "allow another market")
        return OfferNotFoundError(
            f"{what} is not sold as {' or '.join(wanted_markets)} in {', '.join(region_order)} "
            f"(only {' and '.join(sold)}); {fix}", field="priority", request=what)
    capped = [o for o in uncapped
              if max_price_per_hour is None or o.usd_per_hour <= max_price_per_hour]
    if capped or max_price_per_hour is None:
        raise ValueError(f"explain_no_offers was asked about {what}, but offers exist "
                         f"(cheapest: {uncapped[0]}); call it only when find_offers finds none")
    spot: list[Offer] = []
    if "spot" not in wanted_markets:
        spot = find_offers(gpu, regions=region_order, markets=("spot",),
                           max_price_per_hour=max_price_per_hour, require_efa=require_efa,
                           min_vcpus=min_vcpus, min_memory_gib=min_memory_gib, catalog=cat)
    return _over_price_cap(what, uncapped[:3], max_price_per_hour, spot[0] if spot else None)


def _over_price_cap(what: str, cheapest: list[Offer], max_price_per_hour: float,
                    spot: Offer | None) -> OfferNotFoundError:
    """The error when offers exist but ``cheapest`` all cost more than the cap; ``spot`` is
    the cheapest spot offer under the cap when spot was not allowed."""
    listing = "; ".join(str(o) for o in cheapest)
    fixes = [f"raise max_price_per_hour to at least ${cheapest[0].usd_per_hour:,.2f}"]
    if spot is not None:
        fixes.append(f"allow spot with priority='med' or 'low' (from "
                     f"${spot.usd_per_hour:,.2f}/h)")
    fixes.append("ask for a cheaper GPU")
    return OfferNotFoundError(
        f"no offer for {what} costs at most your max_price_per_hour of "
        f"${max_price_per_hour:,.2f} per instance-hour; cheapest: {listing}. To launch, "
        f"{', or '.join(fixes)}",
        field="max_price_per_hour", request=what, cheapest=cheapest,
        max_price_per_hour=max_price_per_hour)


def _no_hardware_message(cat: Catalog, gpu: GpuRequest | None, what: str,
                         min_vcpus: int | None, min_memory_gib: float | None) -> str:
    if gpu is None:
        return (f"no CPU-only instance type has at least {min_vcpus or 0} vCPUs and "
                f"{min_memory_gib or 0:g} GiB memory; lower min_vcpus / min_memory_gib")
    same_model = [i for i in cat.instance_types if i.gpu_model == gpu.model]
    if not same_model:
        return (f"AWS sells no instance type with {gpu.model} GPUs (catalog as of "
                f"{cat.as_of.isoformat()}); choose another GPU model")
    too_many = gpu_count_problem(gpu, cat)
    if too_many is not None:
        return too_many
    if any(i.matches(gpu) for i in same_model):
        return (f"no instance type with {what} has at least {min_vcpus or 0} vCPUs and "
                f"{min_memory_gib or 0:g} GiB memory; lower min_vcpus / min_memory_gib")
    by_shape: dict[str, list[str]] = {}
    for instance in same_model:
        by_shape.setdefault(instance.gpu_description, []).append(instance.name)
    variants = ", ".join(f"{shape} ({', '.join(sorted(names))})"
                         for shape, names in sorted(by_shape.items()))
    examples = " or ".join(sorted({f"gpu={_gpu_text(i)!r}" for i in same_model}))
    return (f"no AWS instance type has exactly {what}; a GPU request must match an instance "
            f"type's GPUs exactly (model, memory, form factor and count). AWS sells {variants}. "
            f"Ask for {examples}")


def gpu_count_problem(gpu: GpuRequest | None, catalog: Catalog | None = None) -> str | None:
    """Why no machine of the catalog can hold ``gpu`` on one node: its count is above the
    largest machine sold with that GPU model. None when one holds that many, for CPU nodes,
    and for a model the catalog does not sell (``any``, or one a refreshed catalog lacks).

    Every provider that maps GPU requests through the catalog refuses such a request with
    this message, before it launches anything."""
    if gpu is None:
        return None
    cat = catalog if catalog is not None else load_catalog()
    same_model = [i for i in cat.instance_types if i.gpu_model == gpu.model]
    if not same_model:
        return None
    most = max(i.gpu_count for i in same_model)
    if gpu.count <= most:
        return None
    largest = sorted((i for i in same_model if i.gpu_count == most), key=lambda i: i.name)
    machines = ", ".join(f"{i.name}: {i.gpu_description}" for i in largest)
    fitting = [i for i in largest if i.gpu_memory_gb == gpu.memory_gb
               and i.form_factor == gpu.form_factor] or largest  # keep the user's memory
    asks = " or ".join(sorted({f"gpu={_gpu_text(i)!r}" for i in fitting}))
    return (f"no machine has {gpu.count} {gpu.model} GPUs: the largest sold with {gpu.model} "
            f"GPUs has {most} ({machines}; catalog as of {cat.as_of.isoformat()}). Ask for "
            f"{asks}, and more nodes (num_instances) for more GPUs")


def _gpu_text(instance: InstanceType) -> str:
    """The shortest ``gpu=`` string that selects ``instance``'s GPUs, e.g. ``a100-80gb:8``."""
    model = find_gpu_model(instance.gpu_model or "")
    if model is None:
        raise ValueError(f"{instance.name} has no GPU model from catalog/gpus.py")
    text = model.name
    if instance.gpu_memory_gb != model.default_memory_gb:
        text += f"-{instance.gpu_memory_gb}gb"
    if instance.form_factor != model.form_factors[0]:
        text += f".{instance.form_factor}"
    return f"{text}:{instance.gpu_count}"


def plan_offers(
    spec: OfferRequest,
    *,
    regions: Sequence[str] | None = None,
    catalog: Catalog | None = None,
) -> list[Offer]:
    """The offers to try for launching ``spec``'s nodes, in order; never empty.

    Markets come from ``spec.priority`` and are tried in that preference order, each cheapest
    first; the cap is ``spec.max_price_per_hour``; ``internode_interconnect='efa'`` (or
    ``'infiniband'``, which AWS serves with EFA) requires EFA.
    ``spec.region``, when set, wins over ``regions`` (a provider's default list; None = all).
    Raises OfferNotFoundError saying what ruled everything out and how to fix it, and
    UnknownRegionError for a region the catalog lacks (``field`` is ``region`` when it came
    from ``spec.region``, ``provider_config`` when from ``regions``).
    """
    cat = catalog if catalog is not None else load_catalog()
    markets = markets_for_priority(spec.priority)
    interconnect = (spec.internode_interconnect or "").lower()
    if spec.region:
        region_list = _region_order(cat, [spec.region], field="region")
    else:
        region_list = _region_order(cat, regions, field="provider_config")
    # AWS's RDMA fabric between nodes is EFA: an InfiniBand request is served by EFA.
    require_efa = interconnect in ("efa", "infiniband")
    offers = find_offers(spec.gpu, regions=region_list, markets=markets,
                         max_price_per_hour=spec.max_price_per_hour, require_efa=require_efa,
                         catalog=cat)
    if not offers:
        raise explain_no_offers(spec.gpu, regions=region_list, markets=markets,
                                max_price_per_hour=spec.max_price_per_hour,
                                require_efa=require_efa, catalog=cat)
    return sorted(offers, key=lambda o: markets.index(o.market))  # stable: price order kept
