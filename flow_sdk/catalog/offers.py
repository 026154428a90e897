"""The AWS instance catalog and the ONE place that turns a GPU request into priced offers.

The catalog is data (``aws_instances.csv`` next to this module): one row per instance type per
region, with its hardware and its on-demand and typical spot price in USD per instance-hour.
A refreshed copy at ``$FLOW_HOME/catalog/aws_instances.csv`` (default ``~/.flow``), written by
:func:`update_prices` for ``flow catalog refresh``, overrides the packaged file.

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

import csv
import dataclasses
import difflib
import functools
import io
import math
import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Literal, Protocol

from flow_sdk.catalog.gpus import find_gpu_model
from flow_sdk._config import flow_home
from flow_sdk.errors import FlowError

Market = Literal["on-demand", "spot"]
MARKETS: tuple[Market, ...] = ("on-demand", "spot")
PRIORITY_MARKETS: Mapping[str, tuple[Market, ...]] = MappingProxyType({
    "low": ("spot",),
    "med": ("spot", "on-demand"),
    "high": ("on-demand",),
})

CATALOG_FILENAME = "aws_instances.csv"
COLUMNS: tuple[str, ...] = (
    "instance_type",
    "region",
    "gpu_model",
    "gpu_count",
    "gpu_memory_gb",
    "form_factor",
    "vcpus",
    "memory_gib",
    "efa_supported",
    "efa_interfaces",
    "on_demand_usd_per_hour",
    "spot_usd_per_hour",
)
_META_RE = re.compile(r"^#\s*(?P<key>[a-z_]+):\s*(?P<value>.*)$")
_REGION_RE = re.compile(r"^[a-z]{2}(?:-[a-z]+)+-\d+$")


# --------------------------------------------------------------------------------------------
# errors


class CatalogError(FlowError, ValueError):
    """The catalog file is missing or malformed. Names the file, the line and the fix."""


class UnknownRegionError(FlowError, ValueError):
    """A region was asked for that the catalog does not list."""

    def __init__(self, region: str, known: Sequence[str], *, as_of: date) -> None:
        self.region = region
        self.known = tuple(known)
        close = difflib.get_close_matches(region, self.known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        super().__init__(
            f"region {region!r} is not in the AWS instance catalog{hint}; catalog regions "
            f"(as of {as_of.isoformat()}): {', '.join(self.known)}. Choose one of these, or run "
            "`flow catalog refresh` if AWS has added the region since"
        )


class OfferNotFoundError(FlowError, LookupError):
    """No catalog offer satisfies the request.

    ``cheapest`` holds the cheapest offers that only the price cap excluded (empty when
    something other than the cap ruled everything out); the message names the fix.
    """

    def __init__(
        self,
        message: str,
        *,
        request: str,
        cheapest: Sequence[Offer] = (),
        max_price_per_hour: float | None = None,
    ) -> None:
        super().__init__(message)
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


class LaunchRequest(Protocol):
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

    def check_regions(self, regions: Iterable[str]) -> tuple[str, ...]:
        """``regions`` as a tuple with duplicates removed; raises UnknownRegionError."""
        known = set(self.regions)
        result: list[str] = []
        for region in regions:
            if region not in known:
                raise UnknownRegionError(region, self.regions, as_of=self.as_of)
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


# --------------------------------------------------------------------------------------------
# loading and writing


def user_catalog_path() -> Path:
    """Where a refreshed catalog lives: ``$FLOW_HOME/catalog/aws_instances.csv``."""
    return flow_home(create=False) / "catalog" / CATALOG_FILENAME


def load_catalog(path: str | os.PathLike[str] | None = None) -> Catalog:
    """Load the catalog at ``path``; by default the user's refreshed copy if it exists, else the
    packaged one. Parsed once per file version and cached."""
    if path is None:
        user = user_catalog_path()
        if not user.is_file():
            return _load_packaged()
        path = user
    file = Path(path)
    try:
        stat = file.stat()
    except FileNotFoundError:
        raise CatalogError(f"catalog file {file} does not exist; pass an existing file or "
                           "run `flow catalog refresh`") from None
    return _load_file(str(file.resolve()), stat.st_ino, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=1)
def _load_packaged() -> Catalog:
    resource = resources.files("flow_sdk.catalog").joinpath(CATALOG_FILENAME)
    text = resource.read_text(encoding="utf-8")
    return parse_catalog(text, origin=f"flow_sdk/catalog/{CATALOG_FILENAME}")


@functools.lru_cache(maxsize=8)
def _load_file(path: str, inode: int, mtime_ns: int, size: int) -> Catalog:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogError(f"cannot read catalog file {path}: {exc}; delete it to fall back to "
                           "the packaged catalog, or run `flow catalog refresh`") from exc
    return parse_catalog(text, origin=path)


def parse_catalog(text: str, *, origin: str = "<string>") -> Catalog:
    """Parse catalog CSV text (``# key: value`` comment lines, a header, rows) and check it."""
    comments: list[str] = []
    meta: dict[str, str] = {}
    body: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("#"):
            if not body:  # comments before the header are the file's metadata; later ones notes
                comments.append(line)
                match = _META_RE.match(line)
                if match:
                    meta[match["key"]] = match["value"].strip()
        elif line.strip():
            body.append((number, line))
    fix = "delete the file to fall back to the packaged catalog, or run `flow catalog refresh`"
    if not body:
        raise CatalogError(f"{origin}: no header row and no rows; {fix}")
    try:
        as_of = date.fromisoformat(meta.get("as_of", ""))
    except ValueError:
        raise CatalogError(f"{origin}: needs a '# as_of: YYYY-MM-DD' comment line before the "
                           f"header; {fix}") from None
    source = meta.get("source", "")
    if not source:
        raise CatalogError(f"{origin}: needs a '# source: ...' comment line before the header; "
                           f"{fix}")
    header_line, header_text = body[0]
    header = next(csv.reader([header_text]))
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise CatalogError(f"{origin}:{header_line}: header lacks columns {missing}; {fix}")
    entries: list[CatalogEntry] = []
    seen: dict[tuple[str, str], int] = {}
    hardware: dict[str, InstanceType] = {}
    for number, line in body[1:]:
        values = next(csv.reader([line]))
        if len(values) != len(header):
            raise CatalogError(f"{origin}:{number}: {len(values)} fields, header has "
                               f"{len(header)}; {fix}")
        row = dict(zip(header, values, strict=True))
        try:
            entry = _entry_from_row(row)
        except ValueError as exc:
            raise CatalogError(f"{origin}:{number}: {exc}; {fix}") from None
        key = (entry.instance.name, entry.region)
        if key in seen:
            raise CatalogError(f"{origin}:{number}: {key[0]} in {key[1]} repeats line "
                               f"{seen[key]}; {fix}")
        seen[key] = number
        previous = hardware.setdefault(entry.instance.name, entry.instance)
        if previous != entry.instance:
            raise CatalogError(f"{origin}:{number}: hardware of {entry.instance.name} differs "
                               f"from its earlier rows; {fix}")
        entries.append(entry)
    if not entries:
        raise CatalogError(f"{origin}: the catalog has no rows; {fix}")
    return Catalog(tuple(entries), as_of, source, origin, tuple(comments))


def _entry_from_row(row: Mapping[str, str]) -> CatalogEntry:
    name = row["instance_type"].strip()
    region = row["region"].strip()
    if not name:
        raise ValueError("instance_type is empty")
    if not _REGION_RE.match(region):
        raise ValueError(f"region {region!r} is not an AWS region name such as 'us-east-1'")
    gpu_name = row["gpu_model"].strip()
    gpu_count = _int(row, "gpu_count")
    gpu_memory = _int(row, "gpu_memory_gb")
    form = row["form_factor"].strip()
    if gpu_name:
        model = find_gpu_model(gpu_name)
        if model is None or model.name != gpu_name:
            raise ValueError(f"gpu_model {gpu_name!r} is not a canonical name in catalog/gpus.py")
        if gpu_count < 1:
            raise ValueError(f"gpu_count must be at least 1 for a {gpu_name} type")
        if gpu_memory not in model.memory_gb:
            raise ValueError(f"{gpu_name} comes with {model.memory_gb} GB, not {gpu_memory}")
        if form not in model.form_factors:
            raise ValueError(f"{gpu_name} comes as {model.form_factors}, not {form!r}")
    elif gpu_count or gpu_memory or form:
        raise ValueError("a row without gpu_model needs gpu_count 0, gpu_memory_gb 0 and "
                         "no form_factor")
    efa = _bool(row, "efa_supported")
    efa_interfaces = _int(row, "efa_interfaces")
    if efa != (efa_interfaces > 0):
        raise ValueError("efa_interfaces must be positive exactly when efa_supported is true")
    vcpus = _int(row, "vcpus")
    memory = _float(row, "memory_gib")
    if vcpus < 1 or memory <= 0:
        raise ValueError("vcpus and memory_gib must be positive")
    instance = InstanceType(
        name=name,
        gpu_model=gpu_name or None,
        gpu_count=gpu_count,
        gpu_memory_gb=gpu_memory,
        form_factor=form or None,
        vcpus=vcpus,
        memory_gib=memory,
        efa_supported=efa,
        efa_interfaces=efa_interfaces,
    )
    on_demand = _price(_float(row, "on_demand_usd_per_hour"), "on_demand_usd_per_hour")
    spot_text = row["spot_usd_per_hour"].strip()
    spot = _price(_float(row, "spot_usd_per_hour"), "spot_usd_per_hour") if spot_text else None
    _check_spot(on_demand, spot)
    return CatalogEntry(instance, region, on_demand, spot)


def _int(row: Mapping[str, str], column: str) -> int:
    try:
        value = int(row[column].strip())
    except ValueError:
        raise ValueError(f"{column} must be a whole number, got {row[column]!r}") from None
    if value < 0:
        raise ValueError(f"{column} must not be negative, got {value}")
    return value


def _float(row: Mapping[str, str], column: str) -> float:
    try:
        return float(row[column].strip())
    except ValueError:
        raise ValueError(f"{column} must be a number, got {row[column]!r}") from None


def _bool(row: Mapping[str, str], column: str) -> bool:
    value = row[column].strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"{column} must be 'true' or 'false', got {row[column]!r}")
    return value == "true"


def _price(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a positive, finite USD amount, got {value!r}")
    return float(value)


def _check_spot(on_demand: float, spot: float | None) -> None:
    if spot is not None and spot > on_demand:
        raise ValueError(f"spot price {spot} exceeds the on-demand price {on_demand}; "
                         "EC2 never charges more than on-demand for spot")


def _number_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def format_catalog(catalog: Catalog) -> str:
    """The catalog as CSV text that :func:`parse_catalog` reads back to an equal catalog."""
    out = io.StringIO()
    wrote: set[str] = set()
    for line in catalog.comments:
        match = _META_RE.match(line)
        key = match["key"] if match else None
        if key == "as_of":
            line = f"# as_of: {catalog.as_of.isoformat()}"
        elif key == "source":
            line = f"# source: {_one_line(catalog.source)}"
        if key:
            wrote.add(key)
        out.write(line + "\n")
    if "as_of" not in wrote:
        out.write(f"# as_of: {catalog.as_of.isoformat()}\n")
    if "source" not in wrote:
        out.write(f"# source: {_one_line(catalog.source)}\n")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for entry in catalog.entries:
        hw = entry.instance
        writer.writerow([
            hw.name,
            entry.region,
            hw.gpu_model or "",
            hw.gpu_count,
            hw.gpu_memory_gb,
            hw.form_factor or "",
            hw.vcpus,
            _number_text(hw.memory_gib),
            "true" if hw.efa_supported else "false",
            hw.efa_interfaces,
            _number_text(entry.on_demand_usd_per_hour),
            "" if entry.spot_usd_per_hour is None else _number_text(entry.spot_usd_per_hour),
        ])
    return out.getvalue()


def _one_line(text: str) -> str:
    return " ".join(text.split())


PriceUpdates = Mapping[tuple[str, str], Mapping[str, float | None]]


def update_prices(
    prices: PriceUpdates,
    dest: str | os.PathLike[str],
    *,
    source: str,
    as_of: date | None = None,
    base: Catalog | None = None,
) -> Catalog:
    """Write a copy of ``base`` (default: the current catalog) with new prices to ``dest``.

    ``prices`` maps ``(instance_type, region)`` to ``{"on-demand": usd, "spot": usd | None}``;
    a market left out keeps its price, ``"spot": None`` marks spot as not sold there. A known
    instance type in a region it lacks gets a new row (it then needs an on-demand price).
    The file is replaced atomically; returns the catalog as written.
    """
    catalog = base if base is not None else load_catalog()
    if not _one_line(source):
        raise ValueError("source must say where the new prices come from")
    by_key = {(e.instance.name, e.region): e for e in catalog.entries}
    entries = list(catalog.entries)
    for (name, region), update in prices.items():
        unknown = set(update) - set(MARKETS)
        if unknown:
            raise ValueError(f"{name} in {region}: unknown market(s) {sorted(unknown)}; "
                             f"use {list(MARKETS)}")
        if not _REGION_RE.match(region):
            raise ValueError(f"{region!r} is not an AWS region name such as 'us-east-1'")
        current = by_key.get((name, region))
        if current is None:
            try:
                instance = catalog.instance_type(name)
            except KeyError as exc:
                raise CatalogError(f"{exc.args[0]}; the catalog only reprices known types, "
                                   "add new types to the packaged CSV") from None
            if update.get("on-demand") is None:
                raise ValueError(f"{name} in {region} is a new row and needs an on-demand price")
            current = CatalogEntry(instance, region, 1.0, None)
        on_demand = current.on_demand_usd_per_hour
        spot = current.spot_usd_per_hour
        if "on-demand" in update:
            raw = update["on-demand"]
            if raw is None:
                raise ValueError(f"{name} in {region}: on-demand price cannot be None")
            on_demand = _price(raw, f"{name} in {region}: on-demand price")
        if "spot" in update:
            raw_spot = update["spot"]
            spot = None if raw_spot is None else _price(raw_spot, f"{name} in {region}: spot price")
        try:
            _check_spot(on_demand, spot)
        except ValueError as exc:
            raise ValueError(f"{name} in {region}: {exc}") from None
        updated = dataclasses.replace(current, on_demand_usd_per_hour=on_demand,
                                      spot_usd_per_hour=spot)
        if (name, region) in by_key:
            entries[entries.index(by_key[(name, region)])] = updated
        else:
            entries.append(updated)
        by_key[(name, region)] = updated
    target = Path(dest)
    target.parent.mkdir(parents=True, exist_ok=True)
    target = target.resolve()
    new = Catalog(tuple(entries), as_of or date.today(), _one_line(source), str(target),
                  catalog.comments)
    text = format_catalog(new)
    parse_catalog(text, origin=str(target))
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return new


# --------------------------------------------------------------------------------------------
# lookup


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


def _region_order(cat: Catalog, regions: Sequence[str] | None) -> tuple[str, ...]:
    if regions is None:
        return cat.regions
    if isinstance(regions, str):
        raise TypeError(f"regions must be a list of region names, not the string {regions!r}")
    if not regions:
        raise ValueError("regions is empty; pass None to search every catalog region")
    return cat.check_regions(regions)


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
    region_order = _region_order(cat, regions)
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


def cheapest_offers(
    gpu: GpuRequest | None,
    n: int = 3,
    *,
    regions: Sequence[str] | None = None,
    markets: Sequence[str] = MARKETS,
    require_efa: bool = False,
    min_vcpus: int | None = None,
    min_memory_gib: float | None = None,
    catalog: Catalog | None = None,
) -> list[Offer]:
    """The ``n`` cheapest offers for the request with no price cap (for error messages)."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    return find_offers(gpu, regions=regions, markets=markets, require_efa=require_efa,
                       min_vcpus=min_vcpus, min_memory_gib=min_memory_gib, catalog=catalog)[:n]


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
    region_order = _region_order(cat, regions)
    wanted_markets = _check_markets(markets)
    hardware = [e for e in cat.entries if _hardware_ok(e.instance, gpu, min_vcpus, min_memory_gib)]
    if not hardware:
        return OfferNotFoundError(_no_hardware_message(cat, gpu, what, min_vcpus, min_memory_gib),
                                  request=what)
    in_regions = [e for e in hardware if e.region in region_order]
    if not in_regions:
        offered = sorted({e.region for e in hardware})
        return OfferNotFoundError(
            f"no instance type with {what} is offered in {', '.join(region_order)}; it is offered "
            f"in {', '.join(offered)}. Set region to one of these (or leave it unset)",
            request=what)
    with_efa = [e for e in in_regions if e.instance.efa_supported or not require_efa]
    if not with_efa:
        names = sorted({e.instance.name for e in in_regions})
        return OfferNotFoundError(
            f"no instance type with {what} in {', '.join(region_order)} supports EFA "
            f"({', '.join(names)} do not); drop internode_interconnect='efa' to use ethernet, "
            "or pick a GPU whose instance types have EFA", request=what)
    uncapped = find_offers(gpu, regions=region_order, markets=wanted_markets,
                           require_efa=require_efa, min_vcpus=min_vcpus,
                           min_memory_gib=min_memory_gib, catalog=cat)
    if not uncapped:
        sold = [m for m in MARKETS if any(e.price(m) is not None for e in with_efa)]
        fix = ("use priority='med' (spot, then on-demand) or 'high' (on-demand)"
               if "on-demand" in sold else "allow another market")
        return OfferNotFoundError(
            f"{what} is not sold as {' or '.join(wanted_markets)} in {', '.join(region_order)} "
            f"(only {' and '.join(sold)}); {fix}", request=what)
    capped = [o for o in uncapped
              if max_price_per_hour is None or o.usd_per_hour <= max_price_per_hour]
    if capped or max_price_per_hour is None:
        raise ValueError(f"explain_no_offers was asked about {what}, but offers exist "
                         f"(cheapest: {uncapped[0]}); call it only when find_offers finds none")
    cheapest = uncapped[:3]
    listing = "; ".join(str(o) for o in cheapest)
    fixes = [f"raise max_price_per_hour to at least ${cheapest[0].usd_per_hour:,.2f}"]
    if "spot" not in wanted_markets:
        spot = find_offers(gpu, regions=region_order, markets=("spot",),
                           max_price_per_hour=max_price_per_hour, require_efa=require_efa,
                           min_vcpus=min_vcpus, min_memory_gib=min_memory_gib, catalog=cat)
        if spot:
            fixes.append(f"allow spot with priority='med' or 'low' (from "
                         f"${spot[0].usd_per_hour:,.2f}/h)")
    fixes.append("ask for a cheaper GPU")
    return OfferNotFoundError(
        f"no offer for {what} costs at most your max_price_per_hour of "
        f"${max_price_per_hour:,.2f} per instance-hour; cheapest: {listing}. To launch, "
        f"{', or '.join(fixes)}",
        request=what, cheapest=cheapest, max_price_per_hour=max_price_per_hour)


def _no_hardware_message(cat: Catalog, gpu: GpuRequest | None, what: str,
                         min_vcpus: int | None, min_memory_gib: float | None) -> str:
    if gpu is None:
        return (f"no CPU-only instance type has at least {min_vcpus or 0} vCPUs and "
                f"{min_memory_gib or 0:g} GiB memory; lower min_vcpus / min_memory_gib")
    same_model = [i for i in cat.instance_types if i.gpu_model == gpu.model]
    if not same_model:
        return (f"AWS sells no instance type with {gpu.model} GPUs (catalog as of "
                f"{cat.as_of.isoformat()}); choose another GPU model")
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
    spec: LaunchRequest,
    *,
    regions: Sequence[str] | None = None,
    catalog: Catalog | None = None,
) -> list[Offer]:
    """The offers to try for launching ``spec``'s nodes, in order; never empty.

    Markets come from ``spec.priority`` and are tried in that preference order, each cheapest
    first; the cap is ``spec.max_price_per_hour``; ``internode_interconnect='efa'`` (or
    ``'infiniband'``, which AWS serves with EFA) requires EFA.
    ``spec.region``, when set, wins over ``regions`` (a provider's default list; None = all).
    Raises OfferNotFoundError saying what ruled everything out and how to fix it.
    """
    cat = catalog if catalog is not None else load_catalog()
    markets = markets_for_priority(spec.priority)
    interconnect = (spec.internode_interconnect or "").lower()
    region_list = [spec.region] if spec.region else regions
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
