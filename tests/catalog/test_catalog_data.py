"""The packaged AWS instance catalog: its content, and how catalog files are read."""

from __future__ import annotations

import csv
import io
from datetime import date
from importlib import resources
from pathlib import Path

import pytest

from flow_sdk.catalog import (
    COLUMNS,
    GPU_MODELS,
    CatalogError,
    find_gpu_model,
    format_catalog,
    load_catalog,
    parse_catalog,
    user_catalog_path,
)

REQUIRED_TYPES: dict[str, tuple[str | None, int, int]] = {
    # instance type: (gpu model, gpu count, memory per GPU)
    "p5.48xlarge": ("h100", 8, 80),
    "p5e.48xlarge": ("h200", 8, 141),
    "p5en.48xlarge": ("h200", 8, 141),
    "p4d.24xlarge": ("a100", 8, 40),
    "p4de.24xlarge": ("a100", 8, 80),
    "p6-b200.48xlarge": ("b200", 8, 180),
    "g5.xlarge": ("a10g", 1, 24),
    "g5.2xlarge": ("a10g", 1, 24),
    "g5.12xlarge": ("a10g", 4, 24),
    "g5.48xlarge": ("a10g", 8, 24),
    "g6.xlarge": ("l4", 1, 24),
    "g6.12xlarge": ("l4", 4, 24),
    "g6.48xlarge": ("l4", 8, 24),
    "g6e.xlarge": ("l40s", 1, 48),
    "g6e.12xlarge": ("l40s", 4, 48),
    "g6e.48xlarge": ("l40s", 8, 48),
    "g4dn.xlarge": ("t4", 1, 16),
    "g4dn.12xlarge": ("t4", 4, 16),
    "g4dn.metal": ("t4", 8, 16),
    "p3.2xlarge": ("v100", 1, 16),
    "p3.8xlarge": ("v100", 4, 16),
    "p3.16xlarge": ("v100", 8, 16),
    "p3dn.24xlarge": ("v100", 8, 32),
    "c7i.xlarge": (None, 0, 0),
    "c7i.4xlarge": (None, 0, 0),
    "m7i.2xlarge": (None, 0, 0),
}

# GPU (model, memory) variants in gpus.py that AWS does not sell. Empty today: keep it explicit
# so adding a GPU to gpus.py without an AWS type is a conscious choice.
NOT_SOLD_ON_AWS: set[tuple[str, int]] = set()


def _raw_rows() -> list[dict[str, str]]:
    """The packaged CSV read with the csv module alone, independent of the loader."""
    text = resources.files("flow_sdk.catalog").joinpath("aws_instances.csv").read_text("utf-8")
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    return list(csv.DictReader(io.StringIO(body)))


def test_packaged_catalog_states_its_date_and_source() -> None:
    catalog = load_catalog()
    assert catalog.as_of == date(2026, 11, 21)
    assert "AWS" in catalog.source and "pricing" in catalog.source
    assert catalog.origin.endswith("aws_instances.csv")


def test_csv_header_has_every_column() -> None:
    assert set(COLUMNS) <= set(_raw_rows()[0])


def test_every_row_names_a_gpu_model_from_gpus_py() -> None:
    for row in _raw_rows():
        if row["gpu_model"] == "":
            assert row["gpu_count"] == "0", row
            continue
        model = find_gpu_model(row["gpu_model"])
        assert model is not None and model.name == row["gpu_model"], row
        assert int(row["gpu_memory_gb"]) in model.memory_gb, row
        assert row["form_factor"] in model.form_factors, row


@pytest.mark.parametrize(
    ("model", "memory_gb"),
    [(m.name, mem) for m in GPU_MODELS for mem in m.memory_gb
     if (m.name, mem) not in NOT_SOLD_ON_AWS],
)
def test_every_gpu_aws_sells_maps_to_an_instance_type(model: str, memory_gb: int) -> None:
    matches = [i for i in load_catalog().instance_types
               if i.gpu_model == model and i.gpu_memory_gb == memory_gb]
    assert matches, f"no instance type for {model}-{memory_gb}gb"


@pytest.mark.parametrize(("name", "expected"), sorted(REQUIRED_TYPES.items()))
def test_required_instance_types_are_present(name: str,
                                            expected: tuple[str | None, int, int]) -> None:
    instance = load_catalog().instance_type(name)
    assert (instance.gpu_model, instance.gpu_count, instance.gpu_memory_gb) == expected


def test_prices_are_positive_and_spot_is_below_on_demand() -> None:
    entries = load_catalog().entries
    for entry in entries:
        assert entry.on_demand_usd_per_hour > 0, entry
        if entry.spot_usd_per_hour is not None:
            assert 0 < entry.spot_usd_per_hour < entry.on_demand_usd_per_hour, entry
    assert any(e.spot_usd_per_hour is not None for e in entries)


def test_regions_and_regional_prices() -> None:
    catalog = load_catalog()
    assert {"us-east-1", "us-east-2", "us-west-2", "eu-west-1"} <= set(catalog.regions)
    g5 = {e.region: e.on_demand_usd_per_hour for e in catalog.entries
          if e.instance.name == "g5.xlarge"}
    assert g5["eu-west-1"] > g5["us-east-1"]
    # Not every type is sold everywhere.
    assert not any(e.instance.name == "p5.48xlarge" and e.region == "eu-west-1"
                   for e in catalog.entries)


def test_efa_columns_are_consistent() -> None:
    catalog = load_catalog()
    for instance in catalog.instance_types:
        assert instance.efa_supported == (instance.efa_interfaces > 0), instance
    assert catalog.instance_type("p5.48xlarge").efa_interfaces == 32
    assert catalog.instance_type("p4d.24xlarge").efa_interfaces == 4
    assert not catalog.instance_type("g5.xlarge").efa_supported


def test_cpu_only_types_have_no_gpus() -> None:
    cpu = [i for i in load_catalog().instance_types if i.gpu_model is None]
    assert {i.name for i in cpu} >= {"c7i.xlarge", "c7i.4xlarge", "m7i.2xlarge"}
    assert all(i.gpu_count == 0 and i.form_factor is None for i in cpu)


def test_format_then_parse_gives_the_same_catalog() -> None:
    catalog = load_catalog()
    again = parse_catalog(format_catalog(catalog), origin=catalog.origin)
    assert again.entries == catalog.entries
    assert (again.as_of, again.source, again.comments) == (catalog.as_of, catalog.source,
                                                           catalog.comments)


def test_packaged_catalog_is_loaded_once() -> None:
    assert load_catalog() is load_catalog()


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


HEADER = "# as_of: 2027-01-02\n# source: test\n" + ",".join(COLUMNS) + "\n"
P5_ROW = "p5.48xlarge,us-east-1,h100,8,80,sxm,192,2048,true,32,50.5,20.25\n"


def test_user_copy_in_flow_home_overrides_the_packaged_one(_isolated_flow_home: Path) -> None:
    path = user_catalog_path()
    assert path == _isolated_flow_home / "catalog" / "aws_instances.csv"
    _write(path, HEADER + P5_ROW)
    catalog = load_catalog()
    assert catalog.as_of == date(2027, 1, 2)
    assert [e.on_demand_usd_per_hour for e in catalog.entries] == [50.5]


def test_a_changed_file_is_read_again(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.csv", HEADER + P5_ROW)
    assert load_catalog(path).entries[0].spot_usd_per_hour == 20.25
    cpu_row = "c7i.xlarge,us-east-1,,0,0,,4,8,false,0,0.2,\n"
    _write(path, HEADER + P5_ROW.replace("20.25", "19.5") + cpu_row)
    reloaded = load_catalog(path)
    assert reloaded.entries[0].spot_usd_per_hour == 19.5
    assert reloaded.entries[1].spot_usd_per_hour is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (HEADER + P5_ROW.replace("h100", "h900"), r"c\.csv:4: gpu_model 'h900'"),
        (HEADER + P5_ROW.replace(",80,", ",96,"), r"c\.csv:4: h100 comes with"),
        (HEADER + P5_ROW.replace("20.25", "60"), r"c\.csv:4: spot price 60.0 exceeds"),
        (HEADER + P5_ROW.replace("50.5", "-1"),
         r"c\.csv:4: on_demand_usd_per_hour must be a positive"),
        (HEADER + P5_ROW.replace("true,32", "true,0"), r"c\.csv:4: efa_interfaces"),
        (HEADER + P5_ROW.replace("us-east-1", "moon"), r"c\.csv:4: region 'moon'"),
        (HEADER + P5_ROW + P5_ROW, r"c\.csv:5: p5.48xlarge in us-east-1 repeats line 4"),
        (HEADER + P5_ROW + P5_ROW.replace("us-east-1", "us-west-2").replace(",192,", ",96,"),
         r"c\.csv:5: hardware of p5.48xlarge differs"),
        (HEADER + P5_ROW.replace(",sxm,", ",sxm,extra,"), r"c\.csv:4: 13 fields"),
        (HEADER.replace("2027-01-02", "soon") + P5_ROW, r"as_of: YYYY-MM-DD"),
        (HEADER.replace("# source: test\n", "") + P5_ROW, r"source"),
        (HEADER.replace("vcpus,", ""), r"header lacks columns \['vcpus'\]"),
        (HEADER, r"no rows"),
    ],
    ids=["unknown-gpu", "bad-memory", "spot-above-on-demand", "negative-price", "efa-mismatch",
         "bad-region", "duplicate-row", "hardware-differs", "extra-field", "bad-date",
         "no-source", "missing-column", "no-rows"],
)
def test_malformed_catalogs_are_rejected_with_file_and_line(tmp_path: Path, text: str,
                                                            expected: str) -> None:
    path = _write(tmp_path / "c.csv", text)
    with pytest.raises(CatalogError, match=expected) as info:
        load_catalog(path)
    assert "flow catalog refresh" in str(info.value)
    assert info.value.field == "gpu"  # a broken catalog stops the GPU offer lookup


def test_missing_catalog_file_is_a_catalog_error(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="does not exist") as info:
        load_catalog(tmp_path / "nope.csv")
    assert info.value.field == "gpu"


def test_an_unreadable_catalog_file_is_a_catalog_error(tmp_path: Path) -> None:
    path = tmp_path / "c.csv"
    path.write_bytes(b"\xff\xfe not utf-8")
    with pytest.raises(CatalogError, match="cannot read catalog file") as info:
        load_catalog(path)
    assert info.value.field == "gpu"


def test_comment_lines_after_the_header_are_skipped(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.csv", HEADER + "# p5 rows\n" + P5_ROW + "\n")
    catalog = load_catalog(path)
    assert len(catalog.entries) == 1
    assert catalog.origin == str(path.resolve())
    assert "# p5 rows" not in catalog.comments
