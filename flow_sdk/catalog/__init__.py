"""Static data about hardware and its prices: GPU models, and the AWS instance catalog.

One module per job: ``gpus`` (the GPU models), ``model`` (instance types, catalog entries,
offers, the catalog and its errors), ``file`` (the CSV format, loading, writing new prices),
``refresh`` (fetching prices from AWS) and ``aws_offers`` (matching a request to offers).
Import these names from ``flow_sdk.catalog``; the module layout may change.
"""

from flow_sdk.catalog.gpus import GPU_MODELS, INTRANODE_INTERCONNECTS, GpuModel, find_gpu_model
from flow_sdk.catalog.model import (
    MARKETS,
    REGION_RE,
    Catalog,
    CatalogEntry,
    CatalogError,
    GpuRequest,
    InstanceType,
    Market,
    Offer,
    OfferNotFoundError,
    UnknownRegionError,
)
from flow_sdk.catalog.file import (
    CATALOG_FILENAME,
    COLUMNS,
    PriceUpdates,
    format_catalog,
    load_catalog,
    parse_catalog,
    update_prices,
    user_catalog_path,
)
from flow_sdk.catalog.aws_offers import (
    PRIORITY_MARKETS,
    OfferRequest,
    explain_no_offers,
    find_offers,
    gpu_count_problem,
    markets_for_priority,
    plan_offers,
)
from flow_sdk.catalog.refresh import (
    LINUX_SHARED,
    PRICING_REGION,
    RefreshReport,
    fetch_on_demand,
    fetch_spot,
    refresh_catalog,
)

__all__ = [
    "CATALOG_FILENAME", "COLUMNS", "GPU_MODELS", "INTRANODE_INTERCONNECTS", "LINUX_SHARED", "MARKETS", "PRICING_REGION",
    "PRIORITY_MARKETS", "REGION_RE",
    "Catalog", "CatalogEntry", "CatalogError", "GpuModel", "GpuRequest", "InstanceType",
    "Market", "Offer", "OfferNotFoundError", "OfferRequest", "PriceUpdates", "RefreshReport",
    "UnknownRegionError", "explain_no_offers", "fetch_on_demand", "fetch_spot",
    "find_gpu_model", "find_offers", "format_catalog", "gpu_count_problem", "load_catalog",
    "markets_for_priority",
    "parse_catalog", "plan_offers", "refresh_catalog", "update_prices", "user_catalog_path",
]
