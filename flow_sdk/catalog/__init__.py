"""Static data about hardware: GPU models (here) and, per provider, instance offers."""

from flow_sdk.catalog.gpus import GPU_MODELS, GpuModel, find_gpu_model
from flow_sdk.catalog.offers import (
    MARKETS,
    CatalogError,
    Market,
    Offer,
    OfferNotFoundError,
    UnknownRegionError,
    load_catalog,
    markets_for_priority,
    plan_offers,
)

__all__ = ["GPU_MODELS", "MARKETS", "CatalogError", "GpuModel", "Market", "Offer",
           "OfferNotFoundError", "UnknownRegionError", "find_gpu_model", "load_catalog",
           "markets_for_priority", "plan_offers"]
