"""Catalog helpers shared by test modules (importable as ``catalog_testing``)."""

from __future__ import annotations

from collections.abc import Sequence

from flow_sdk.catalog import MARKETS, Catalog, GpuRequest, Offer, find_offers


def cheapest_offers(
    gpu: GpuRequest | None,
    n: int = 3,
    *,
    regions: Sequence[str] | None = None,
    markets: Sequence[str] = MARKETS,
    require_efa: bool = False,
    catalog: Catalog | None = None,
) -> list[Offer]:
    """The ``n`` cheapest offers for the request with no price cap: what a price-cap error
    should list."""
    return find_offers(gpu, regions=regions, markets=markets, require_efa=require_efa,
                       catalog=catalog)[:n]
