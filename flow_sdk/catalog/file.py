"""The catalog file: its CSV format, where it is loaded from, and writing new prices into it.

The catalog is data (``aws_instances.csv`` next to this module): one row per instance type per
region, with its hardware and its on-demand and typical spot price in USD per instance-hour,
after ``# as_of:`` and ``# source:`` comment lines. A refreshed copy at
``$FLOW_HOME/catalog/aws_instances.csv`` (default ``~/.flow``), written by
:func:`update_prices` for ``flow catalog refresh`` (``catalog/refresh.py`` fetches the prices),
overrides the packaged file.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import io
import math
import os
import re
import tempfile
from collections.abc import Mapping
from datetime import date
from importlib import resources
from pathlib import Path

from flow_sdk._config import flow_home
from flow_sdk.catalog.gpus import find_gpu_model
from flow_sdk.catalog.model import (
    MARKETS,
    REGION_RE,
    Catalog,
    CatalogEntry,
    CatalogError,
    InstanceType,
)

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
                           "run `flow catalog refresh`", field="gpu") from None
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
                           "the packaged catalog, or run `flow catalog refresh`",
                           field="gpu") from exc
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
        raise CatalogError(f"{origin}: no header row and no rows; {fix}", field="gpu")
    try:
        as_of = date.fromisoformat(meta.get("as_of", ""))
    except ValueError:
        raise CatalogError(f"{origin}: needs a '# as_of: YYYY-MM-DD' comment line before the "
                           f"header; {fix}", field="gpu") from None
    source = meta.get("source", "")
    if not source:
        raise CatalogError(f"{origin}: needs a '# source: ...' comment line before the header; "
                           f"{fix}", field="gpu")
    header_line, header_text = body[0]
    header = next(csv.reader([header_text]))
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise CatalogError(f"{origin}:{header_line}: header lacks columns {missing}; {fix}",
                           field="gpu")
    entries: list[CatalogEntry] = []
    seen: dict[tuple[str, str], int] = {}
    hardware: dict[str, InstanceType] = {}
    for number, line in body[1:]:
        values = next(csv.reader([line]))
        if len(values) != len(header):
            raise CatalogError(f"{origin}:{number}: {len(values)} fields, header has "
                               f"{len(header)}; {fix}", field="gpu")
        row = dict(zip(header, values, strict=True))
        try:
            entry = _entry_from_row(row)
        except ValueError as exc:
            raise CatalogError(f"{origin}:{number}: {exc}; {fix}", field="gpu") from None
        key = (entry.instance.name, entry.region)
        if key in seen:
            raise CatalogError(f"{origin}:{number}: {key[0]} in {key[1]} repeats line "
                               f"{seen[key]}; {fix}", field="gpu")
        seen[key] = number
        previous = hardware.setdefault(entry.instance.name, entry.instance)
        if previous != entry.instance:
            raise CatalogError(f"{origin}:{number}: hardware of {entry.instance.name} differs "
                               f"from its earlier rows; {fix}", field="gpu")
        entries.append(entry)
    if not entries:
        raise CatalogError(f"{origin}: the catalog has no rows; {fix}", field="gpu")
    return Catalog(tuple(entries), as_of, source, origin, tuple(comments))


def _entry_from_row(row: Mapping[str, str]) -> CatalogEntry:
    name = row["instance_type"].strip()
    region = row["region"].strip()
    if not name:
        raise ValueError("instance_type is empty")
    if not REGION_RE.match(region):
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
        updated = _repriced(catalog, by_key.get((name, region)), name, region, update)
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
    _write_atomically(target, text)
    return new


def _repriced(catalog: Catalog, current: CatalogEntry | None, name: str, region: str,
              update: Mapping[str, float | None]) -> CatalogEntry:
    """``current`` (or a new row of the known type ``name`` in ``region``) with ``update``'s
    prices; a bad market, region or price raises naming the row."""
    unknown = set(update) - set(MARKETS)
    if unknown:
        raise ValueError(f"{name} in {region}: unknown market(s) {sorted(unknown)}; "
                         f"use {list(MARKETS)}")
    if not REGION_RE.match(region):
        raise ValueError(f"{region!r} is not an AWS region name such as 'us-east-1'")
    if current is None:
        try:
            instance = catalog.instance_type(name)
        except KeyError as exc:
            raise CatalogError(f"{exc.args[0]}; the catalog only reprices known types, "
                               "add new types to the packaged CSV", field="gpu") from None
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
    return dataclasses.replace(current, on_demand_usd_per_hour=on_demand,
                               spot_usd_per_hour=spot)


def _write_atomically(target: Path, text: str) -> None:
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
