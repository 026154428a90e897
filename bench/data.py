"""Benchmark of flow_sdk.data against the naive pandas paths, side by side in one run.

    python bench/data.py

(a) rows/s into torch batches on the same parquet data (>= 1 GiB in memory):
    ours      DataConnector.from_parquet(dir).to_torch_dataset(batch_size): float32 per batch
              (the lean default), zero-copy Arrow -> numpy -> torch
    ours_f64  the same with cast_float64=False: float64 kept, the ceiling's own dtype
    naive     pq.read_table(dir).to_pandas() -> df.values -> torch.tensor(slice) per batch
    raw       the pyarrow read ceiling: iterate record batches from the files, touching nothing
              (the faster of a per-row-group dataset scan and ParquetFile.iter_batches)
    raw_cast  for information: the same scan with the float64 -> float32 cast as its only work,
              the least any float32 path must do
    raw_torch for information: the same scan, each column handed to torch zero-copy and cut
              into batch_size-row tensors, nothing else: the least any path that yields
              {column: tensor} batches must do (no cast, no batch crosses a read)
(b) peak RSS of building the xgboost training matrix, each in a fresh subprocess:
    ours   build_quantile_dmatrix(connector, features, "label")  (DataIter -> QuantileDMatrix)
    naive  xgboost.DMatrix(pandas float64 frame, label=...)
    peak = VmHWM at the end minus VmRSS after imports (same imports in both children).

Prints a markdown table with ratios and the command; its figures are kept in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

TARGET_NAIVE = 3.0
TARGET_CEILING = 0.90
TARGET_MEMORY = 3.5
NAIVE_ROUNDS = 3


def status_kib(field: str) -> int:
    """A ``Vm*`` field of /proc/self/status, in KiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def feature_names(cols: int) -> list[str]:
    return [f"f{j:02d}" for j in range(cols)]


def feature_columns(block: np.ndarray, kind: str) -> list[np.ndarray]:
    """The float64 feature columns of one row group.

    ``random``: standard normal doubles, incompressible and plain-encoded, so decoding is
    little more than a copy (the hardest case for any path that does work per value).
    ``typical``: what tabular feature tables tend to hold: prices with 2 decimals, small
    counts, measurements with 4 decimals; zstd-compressed and partly dictionary-encoded.
    """
    if kind == "random":
        return [block[:, j] for j in range(block.shape[1])]
    shapes = (
        lambda x: np.round(x * 100) / 100,
        lambda x: np.round(np.abs(x) * 10),
        lambda x: np.round(x, 4),
    )
    return [shapes[j % 3](block[:, j]) for j in range(block.shape[1])]


def generate(
    directory: Path, rows: int, cols: int, files: int, row_group_rows: int, kind: str
) -> None:
    """``files`` parquet files of float64 features and an int64 label, several row groups each."""
    rng = np.random.default_rng(0)
    names = feature_names(cols)
    per_file = rows // files
    compression = "snappy" if kind == "random" else "zstd"
    for index in range(files):
        count = per_file if index < files - 1 else rows - per_file * (files - 1)
        path = directory / f"part-{index:03d}.parquet"
        writer: pq.ParquetWriter | None = None
        for start in range(0, count, row_group_rows):
            n = min(row_group_rows, count - start)
            block = rng.standard_normal((n, cols))
            columns = dict(zip(names, feature_columns(block, kind), strict=True))
            label = (block[:, 0] + 0.5 * block[:, 1] > 0).astype(np.int64)
            table = pa.table({**columns, "label": label})
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema, compression=compression)
            writer.write_table(table, row_group_size=row_group_rows)
        assert writer is not None
        writer.close()


def warm(directory: Path) -> None:
    """Read every file once so each measurement starts from the page cache."""
    for path in sorted(directory.glob("*.parquet")):
        with open(path, "rb") as handle:
            while handle.read(64 << 20):
                pass


# (a) rows/s into torch batches ---------------------------------------------------------------


def run_ours(directory: Path, batch_size: int, cast_float64: bool = True) -> int:
    from flow_sdk.data import DataConnector

    rows = 0
    connector = DataConnector.from_parquet(directory)
    for batch in connector.to_torch_dataset(batch_size, cast_float64=cast_float64):
        rows += int(batch["label"].shape[0])
    return rows


def run_ours_f64(directory: Path, batch_size: int) -> int:
    return run_ours(directory, batch_size, cast_float64=False)


def run_naive(directory: Path, batch_size: int) -> int:
    import torch

    frame = pq.read_table(directory).to_pandas()
    values = frame.values
    rows = 0
    for start in range(0, len(values), batch_size):
        rows += int(torch.tensor(values[start : start + batch_size]).shape[0])
    del frame, values
    return rows


def scan_batches(directory: Path, cast: bool = False) -> Iterator[pa.RecordBatch]:
    """Record batches of every row group, with the same scan settings as the connector's
    reader (minus its float32 projection unless ``cast``)."""
    import pyarrow.dataset as pds
    import pyarrow.fs as pafs

    parquet = pds.ParquetFileFormat()
    local = pafs.LocalFileSystem()
    # The same scan settings as the connector's reader, minus the float32 projection.
    options = pds.ParquetFragmentScanOptions(
        use_buffered_stream=True, buffer_size=1 << 20, pre_buffer=False
    )
    for path in sorted(directory.glob("*.parquet")):
        fragment = parquet.make_fragment(str(path), filesystem=local)
        projection = None
        if cast:
            projection = {
                field.name: pds.field(field.name).cast(pa.float32())
                if field.type == pa.float64()
                else pds.field(field.name)
                for field in fragment.physical_schema
            }
        for row_group in range(fragment.metadata.num_row_groups):
            yield from fragment.subset(row_group_ids=[row_group]).to_batches(
                columns=projection,
                batch_size=65_536,
                batch_readahead=4,
                fragment_scan_options=options,
                use_threads=True,
            )


def run_raw_scan(directory: Path, batch_size: int) -> int:
    return sum(batch.num_rows for batch in scan_batches(directory))


def run_raw_cast(directory: Path, batch_size: int) -> int:
    return sum(batch.num_rows for batch in scan_batches(directory, cast=True))


def run_raw_torch(directory: Path, batch_size: int) -> int:
    import torch

    rows = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch on read-only Arrow memory
        for batch in scan_batches(directory):
            names = batch.schema.names
            columns = [
                torch.from_numpy(column.to_numpy(zero_copy_only=True)).split(batch_size)
                for column in batch.columns
            ]
            for pieces in zip(*columns, strict=True):
                rows += int(dict(zip(names, pieces, strict=True))["label"].shape[0])
    return rows


def run_raw_iter(directory: Path, batch_size: int) -> int:
    rows = 0
    for path in sorted(directory.glob("*.parquet")):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=65_536):
            rows += batch.num_rows
    return rows


Runs = dict[str, dict[str, list[float]]]

BATCH_PATHS: dict[str, Callable[[Path, int], int]] = {
    "ours": run_ours,
    "ours_f64": run_ours_f64,
    "raw_torch": run_raw_torch,
}
READ_PATHS: dict[str, Callable[[Path, int], int]] = {
    "raw_scan": run_raw_scan,
    "raw_iter": run_raw_iter,
    "raw_cast": run_raw_cast,
}
CEILINGS = ("raw_scan", "raw_iter")


def throughput(directory: Path, rows: int, batch_sizes: list[int], rounds: int) -> Runs:
    """Wall and CPU seconds (all threads of this process) of every path, rounds interleaved.

    Paths that cut torch batches run once per batch size, named ``path@size``; the naive
    path runs at the first batch size only.
    """
    paths: dict[str, tuple[Callable[[Path, int], int], int]] = {
        f"naive@{batch_sizes[0]}": (run_naive, batch_sizes[0])
    }
    for size in batch_sizes:
        paths.update({f"{name}@{size}": (run, size) for name, run in BATCH_PATHS.items()})
    paths.update({name: (run, batch_sizes[0]) for name, run in READ_PATHS.items()})
    times: Runs = {"wall": {name: [] for name in paths}, "cpu": {name: [] for name in paths}}
    for round_index in range(rounds):
        for name, (run, size) in paths.items():
            if name.startswith("naive") and round_index >= NAIVE_ROUNDS:
                continue  # 10-30x slower than the rest: a few runs bound its best time well
            warm(directory)
            gc.collect()
            start, start_cpu = time.perf_counter(), time.process_time()
            seen = run(directory, size)
            elapsed, cpu = time.perf_counter() - start, time.process_time() - start_cpu
            if seen != rows:
                raise AssertionError(f"{name} saw {seen} rows, expected {rows}")
            times["wall"][name].append(elapsed)
            times["cpu"][name].append(cpu)
            print(
                f"  round {round_index + 1}/{rounds} {name:15s} {elapsed:7.3f} s wall "
                f"{cpu:7.3f} s cpu",
                flush=True,
            )
    return times


# (b) peak memory of the xgboost training matrix ----------------------------------------------


def child(kind: str, directory: Path, cols: int) -> None:
    """Build one training matrix; print a JSON line with peak memory above the baseline."""
    import pandas  # noqa: F401  (same imports in both children)
    import pyarrow.dataset  # noqa: F401
    import xgboost as xgb

    from flow_sdk.data import DataConnector, build_quantile_dmatrix

    names = feature_names(cols)
    gc.collect()
    baseline = status_kib("VmRSS")
    start = time.perf_counter()
    if kind == "ours":
        matrix = build_quantile_dmatrix(DataConnector.from_parquet(directory), names, "label")
    else:
        frame = pq.read_table(directory).to_pandas()
        matrix = xgb.DMatrix(frame[names], label=frame["label"])
        del frame
    build_s = time.perf_counter() - start
    gc.collect()
    result = {
        "kind": kind,
        "type": type(matrix).__name__,
        "rows": matrix.num_row(),
        "cols": matrix.num_col(),
        "baseline_mib": baseline / 1024,
        "peak_mib": (status_kib("VmHWM") - baseline) / 1024,
        "after_mib": (status_kib("VmRSS") - baseline) / 1024,
        "build_s": build_s,
    }
    print(json.dumps(result), flush=True)


def memory(directory: Path, cols: int) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for kind in ("ours", "naive"):
        warm(directory)
        output = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                kind,
                "--data",
                str(directory),
                "--cols",
                str(cols),
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        results[kind] = json.loads(output.strip().splitlines()[-1])
        print(
            f"  {kind:6s} peak {results[kind]['peak_mib']:8.1f} MiB above baseline "
            f"({results[kind]['type']}, {results[kind]['build_s']:.1f} s)",
            flush=True,
        )
    return results


# Report --------------------------------------------------------------------------------------


def machine() -> str:
    import torch
    import xgboost

    with open("/proc/meminfo") as meminfo:
        total_kib = int(meminfo.readline().split()[1])
    return (
        f"{os.cpu_count()} cores, {total_kib / 2**20:.1f} GiB RAM, Python "
        f"{platform.python_version()}, pyarrow {pa.__version__}, numpy {np.__version__}, "
        f"torch {torch.__version__}, xgboost {xgboost.__version__}; load average at start "
        f"{os.getloadavg()[0]:.2f}"
    )


def verdict(value: float, target: float) -> str:
    return "met" if value >= target else "MISSED"


def report(
    args: argparse.Namespace,
    data_bytes: int,
    times: Runs,
    mem: dict[str, dict[str, Any]],
    machine_line: str,
    wall_s: float,
) -> str:
    rows, sizes = args.rows, args.batch_sizes
    wall, cpu = times["wall"], times["cpu"]
    best = {name: min(values) for name, values in wall.items()}
    best_cpu = {name: min(values) for name, values in cpu.items()}
    raw = min(CEILINGS, key=lambda name: best[name])
    raw_cpu = min(CEILINGS, key=lambda name: best_cpu[name])

    def of_raw(name: str) -> float:
        return best[raw] / best[name]

    def of_raw_cpu(name: str) -> float:
        return best_cpu[raw_cpu] / best_cpu[name]

    first = sizes[0]
    vs_naive = best[f"naive@{first}"] / best[f"ours@{first}"]
    mem_ratio = mem["naive"]["peak_mib"] / mem["ours"]["peak_mib"]
    targets = [
        "| target | measured | |",
        "|---|---:|---|",
        (
            f"| (a) ours >= {TARGET_NAIVE:.0f}x the naive torch path (batch {first}, wall) | "
            f"{vs_naive:.1f}x | {verdict(vs_naive, TARGET_NAIVE)} |"
        ),
    ]
    for size in sizes:
        ours = f"ours@{size}"
        targets.append(
            f"| (a) ours (default: float32) >= {TARGET_CEILING:.0%} of the raw read ceiling, "
            f"batch {size}: wall; cpu | {of_raw(ours):.0%}; {of_raw_cpu(ours):.0%} | "
            f"{verdict(of_raw(ours), TARGET_CEILING)}; "
            f"{verdict(of_raw_cpu(ours), TARGET_CEILING)} |"
        )
    targets.append(
        f"| (b) peak RSS building the xgboost matrix >= {TARGET_MEMORY}x lower than naive | "
        f"{mem_ratio:.1f}x ({mem['ours']['peak_mib']:.0f} vs {mem['naive']['peak_mib']:.0f} "
        f"MiB) | {verdict(mem_ratio, TARGET_MEMORY)} |"
    )
    outputs = {
        "ours": "float32 tensors",
        "ours_f64": "float64 tensors",
        "raw_torch": "float64 tensors",
        "naive": "float64 tensors",
        "raw_scan": "Arrow float64",
        "raw_iter": "Arrow float64",
        "raw_cast": "Arrow float32",
    }
    table = [
        (
            "| path | batch | output | best wall s | median wall s | best cpu s | M rows/s "
            "| of raw ceiling (wall; cpu) |"
        ),
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for name in wall:
        base, _, size = name.partition("@")
        label = f"{base} (ceiling)" if name == raw else base
        table.append(
            f"| {label} | {size or '-'} | {outputs[base]} | {best[name]:.3f} | "
            f"{statistics.median(wall[name]):.3f} | {best_cpu[name]:.3f} | "
            f"{rows / best[name] / 1e6:.2f} | {of_raw(name):.0%}; {of_raw_cpu(name):.0%} |"
        )
    detail = ["| path | wall s, each run (interleaved) |", "|---|---|"]
    detail += [f"| {name} | {', '.join(f'{t:.3f}' for t in wall[name])} |" for name in wall]
    detail_mem = [
        (
            "| child | matrix | rows x cols | peak above baseline MiB | resident after build MiB "
            "| build s |"
        ),
        "|---|---|---|---:|---:|---:|",
    ]
    for kind in ("ours", "naive"):
        m = mem[kind]
        detail_mem.append(
            f"| {kind} | {m['type']} | {m['rows']} x {m['cols']} | {m['peak_mib']:.0f} | "
            f"{m['after_mib']:.0f} | {m['build_s']:.1f} |"
        )
    for block in (targets, table, detail, detail_mem):
        print()
        print("\n".join(block))
    command = " ".join(["python bench/data.py", *sys.argv[1:]])
    naive_rounds = min(args.rounds, NAIVE_ROUNDS)
    return "\n".join(
        [
            f"### Data connector, {args.data_kind} data",
            "",
            f"Command: `{command}`",
            "",
            (
                f"Data ({args.data_kind}): {rows:,} rows x {args.cols} float64 features + int64 "
                f"label in {args.files} parquet files, row groups of {args.row_group_rows:,} "
                f"rows; {data_bytes / 2**30:.2f} GiB as Arrow in memory. Machine: "
                f"{machine_line}. Whole run {wall_s:.0f} s."
            ),
            "",
            *targets,
            "",
            (
                f"(a) best of {args.rounds} interleaved rounds (naive: {naive_rounds}), page "
                "cache warmed before each run; the ceiling is the faster raw read:"
            ),
            "",
            *table,
            "",
            *detail,
            "",
            "(b), each child a fresh process:",
            "",
            *detail_mem,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=6_000_000)
    parser.add_argument("--cols", type=int, default=24)
    parser.add_argument("--files", type=int, default=3)
    parser.add_argument("--row-group-rows", type=int, default=500_000)
    parser.add_argument(
        "--batch-sizes",
        type=lambda text: [int(part) for part in text.split(",")],
        default=[4_096, 65_536],
        help="torch batch sizes, comma-separated; the first is also the naive path's",
    )
    parser.add_argument("--data-kind", choices=["random", "typical"], default="random")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--data", type=Path, help="reuse (or keep) the dataset in this dir")
    parser.add_argument("--child", choices=["ours", "naive"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.data, args.cols)
        return

    started = time.perf_counter()
    machine_line = machine()
    owned = args.data is None
    directory = Path(tempfile.mkdtemp(prefix="flow-bench-data-")) if owned else args.data
    try:
        if not any(directory.glob("*.parquet")):
            directory.mkdir(parents=True, exist_ok=True)
            print(f"writing {args.rows:,} x {args.cols + 1} rows to {directory} ...", flush=True)
            generate(
                directory, args.rows, args.cols, args.files, args.row_group_rows, args.data_kind
            )
        data_bytes = (args.cols + 1) * 8 * args.rows
        print("(a) rows/s into torch batches", flush=True)
        times = throughput(directory, args.rows, args.batch_sizes, args.rounds)
        print("(b) peak RSS building the xgboost training matrix", flush=True)
        mem = memory(directory, args.cols)
        print(report(args, data_bytes, times, mem, machine_line, time.perf_counter() - started))
    finally:
        if owned:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
