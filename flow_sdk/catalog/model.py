"""The catalog's data model: instance types, their prices per region, offers, and the errors.

An :class:`InstanceType` is the hardware of one EC2 instance type; a :class:`CatalogEntry` is
that type in one region with its on-demand and spot price (USD per instance-hour); an
:class:`Offer` is one (type, region, market, price) a provider can ask for; a :class:`Catalog`
holds the entries of one catalog file. Reading and writing the file lives in
``catalog/file.py``; matching a request to offers in ``catalog/aws_offers.py``.

Every error here carries ``field``: the :class:`flow_sdk.spec.TaskSpec` field (or
``provider_config``) a caller reports the problem under, set where the error is raised.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Literal, Protocol

from flow_sdk.aws_clients import REGION_RE  # the one AWS region pattern
from flow_sdk.errors import FlowError

Market = Literal["on-demand", "spot"]
MARKETS: tuple[Market, ...] = ("on-demand", "spot")


# --------------------------------------------------------------------------------------------
# errors


class CatalogError(FlowError, ValueError):
    """The catalog file is missing or malformed, or cannot serve a request. Names the file,
    the line and the fix; ``field`` is the task field whose lookup it stops (``gpu``: the
    catalog is where GPU offers come from)."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


class UnknownRegionError(FlowError, ValueError):
    """A region was asked for that the catalog does not list; ``field`` says where it was
    asked for (``region`` in the task, or the provider's ``provider_config``)."""

    def __init__(self, region: str, known: Sequence[str], *, as_of: date, field: str) -> None:
        self.region = region
        self.known = tuple(known)
        self.field = field
        close = difflib.get_close_matches(region, self.known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        super().__init__(
            f"region {region!r} is not in the AWS instance catalog{hint}; catalog regions "
            f"(as of {as_of.isoformat()}): {', '.join(self.known)}. Choose one of these, or run "
            "`flow catalog refresh` if AWS has added the region since"
        )


class OfferNotFoundError(FlowError, LookupError):
    """No catalog offer satisfies the request.

    ``field`` is the task field whose value ruled every offer out (``gpu``, ``region``,
    ``internode_interconnect``, ``priority`` or ``max_price_per_hour``). ``cheapest`` holds the
    cheapest offers that only the price cap excluded (empty when something other than the cap
    ruled everything out); the message names the fix.
    """

    def __init__(
        self,
        message: str,
        *,
        field: str,
        request: str,
        cheapest: Sequence[Offer] = (),
        max_price_per_hour: float | None = None,
    ) -> None:
        super().__init__(message)
        self.field = field
        self.request = request
        self.cheapest = tuple(cheapest)
        self.max_price_per_hour = max_price_per_hour


# --------------------------------------------------------------------------------------------
# data types


class GpuRequest(Protocol):
    """What offers need from a GPU request; :class:`flow_sdk.spec.GpuSpec` satisfies it."""

    @property
    def model(self) -> str: ...

    @property
    def memory_gb(self) -> int: ...

    @property
    def form_factor(self) -> str: ...

    @property
    def count(self) -> int: ...


@dataclass(frozen=True)
class InstanceType:
    """The hardware of one EC2 instance type (the same in every region)."""

    name: str
    gpu_model: str | None
    gpu_count: int
    gpu_memory_gb: int
    form_factor: str | None
    vcpus: int
    memory_gib: float
    efa_supported: bool
    efa_interfaces: int

    @property
    def gpu_description(self) -> str:
        """``8x h100-80gb.sxm`` style text, or ``no GPU``."""
        if self.gpu_model is None:
            return "no GPU"
        return f"{self.gpu_count}x {self.gpu_model}-{self.gpu_memory_gb}gb.{self.form_factor}"

    def matches(self, gpu: GpuRequest | None) -> bool:
        """True when this type has exactly the GPUs asked for (or none, for ``gpu=None``)."""
        if gpu is None:
            return self.gpu_count == 0
        return (
            self.gpu_model == gpu.model
            and self.gpu_memory_gb == gpu.memory_gb
            and self.form_factor == gpu.form_factor
            and self.gpu_count == gpu.count
        )


@dataclass(frozen=True)
class CatalogEntry:
    """One instance type in one region, with its prices in USD per instance-hour."""

    instance: InstanceType
    region: str
    on_demand_usd_per_hour: float
    spot_usd_per_hour: float | None

    def price(self, market: Market) -> float | None:
        """The price in ``market``, or None when the type is not sold there in this region."""
        return self.on_demand_usd_per_hour if market == "on-demand" else self.spot_usd_per_hour


@dataclass(frozen=True)
class Offer:
    """An instance type a provider can ask for: region, market and hourly price."""

    instance: InstanceType
    region: str
    market: Market
    usd_per_hour: float

    @property
    def instance_type(self) -> str:
        return self.instance.name

    @property
    def gpu_model(self) -> str | None:
        return self.instance.gpu_model

    @property
    def gpu_count(self) -> int:
        return self.instance.gpu_count

    @property
    def gpu_memory_gb(self) -> int:
        return self.instance.gpu_memory_gb

    @property
    def efa_supported(self) -> bool:
        return self.instance.efa_supported

    @property
    def efa_interfaces(self) -> int:
        return self.instance.efa_interfaces

    @property
    def usd_per_gpu_hour(self) -> float | None:
        """Price per GPU-hour, or None for CPU-only types."""
        return self.usd_per_hour / self.gpu_count if self.gpu_count else None

    def __str__(self) -> str:
        return (f"{self.instance_type} ({self.instance.gpu_description}) {self.market} "
                f"in {self.region} at ${self.usd_per_hour:,.2f}/h")


@dataclass(frozen=True)
class Catalog:
    """The loaded catalog: entries in file order plus the file's date and source."""

    entries: tuple[CatalogEntry, ...]
    as_of: date
    source: str
    origin: str
    comments: tuple[str, ...] = ()

    @functools.cached_property
    def regions(self) -> tuple[str, ...]:
        """Every region the catalog lists, sorted."""
        return tuple(sorted({e.region for e in self.entries}))

    @functools.cached_property
    def instance_types(self) -> tuple[InstanceType, ...]:
        """Every instance type, in file order, once each."""
        return tuple({e.instance.name: e.instance for e in self.entries}.values())

    def instance_type(self, name: str) -> InstanceType:
        """The instance type called ``name``; raises KeyError naming close matches."""
        for instance in self.instance_types:
            if instance.name == name:
                return instance
        close = difflib.get_close_matches(name, [i.name for i in self.instance_types], n=3)
        hint = f"; close names: {', '.join(close)}" if close else ""
        raise KeyError(f"instance type {name!r} is not in the catalog{hint}")

    def check_regions(self, regions: Iterable[str], *, field: str) -> tuple[str, ...]:
        """``regions`` as a tuple with duplicates removed; raises UnknownRegionError naming
        ``field`` (where the regions were asked for)."""
        known = set(self.regions)
        result: list[str] = []
        for region in regions:
            if region not in known:
                raise UnknownRegionError(region, self.regions, as_of=self.as_of, field=field)
            if region not in result:
                result.append(region)
        return tuple(result)

    def offers(self) -> Iterator[Offer]:
        """Every (entry, market) pair that has a price, in file order."""
        for entry in self.entries:
            for market in MARKETS:
                price = entry.price(market)
                if price is not None:
                    yield Offer(entry.instance, entry.region, market, price)
