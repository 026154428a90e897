"""Benchmark of flow_sdk.data against the naive pandas paths, side by side in one run.

    python bench/data.py

(a) rows/s into torch batches on the same parquet data (>= 1 GiB in memory):
    ours   DataConnector.from_parquet(dir).to_torch_dataset(batch_size): float32 per batch,
           zero-copy Arrow -> numpy -> torch
    naive  pq.read_table(dir).to_pandas() -> df.values -> torch.tensor(slice) per batch
    raw    the pyarrow read ceiling: iterate record batches from the files, touching nothing
           (the faster of a per-row-group dataset scan and ParquetFile.iter_batches)
    raw_cast  for information: the same scan with the float64 -> float32 cast as its only work,
           the least any lean (float32) path must do
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
from collections.abc import Callable
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


def generate(directory: Path, rows: int, cols: int, files: int, row_group_rows: int) -> None:
    """``files`` parquet files of float64 features and an int64 label, several row groups each."""
    rng = np.random.default_rng(0)
    names = feature_names(cols)
    per_file = rows // files
    for index in range(files):
        count = per_file if index < files - 1 else rows - per_file * (files - 1)
        path = directory / f"part-{index:03d}.parquet"
        writer: pq.ParquetWriter | None = None
        for start in range(0, count, row_group_rows):
            n = min(row_group_rows, count - start)
            block = rng.standard_normal((n, cols))
            columns = {name: block[:, j] for j, name in enumerate(names)}
            label = (block[:, 0] + 0.5 * block[:, 1] > 0).astype(np.int64)
            table = pa.table({**columns, "label": label})
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema)
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


def run_ours(directory: Path, batch_size: int) -> int:
    from flow_sdk.data import DataConnector

    rows = 0
    for batch in DataConnector.from_parquet(directory).to_torch_dataset(batch_size):
        rows += int(batch["label"].shape[0])
    return rows


def run_naive(directory: Path, batch_size: int) -> int:
    import torch

    frame = pq.read_table(directory).to_pandas()
    values = frame.values
    rows = 0
    for start in range(0, len(values), batch_size):
        rows += int(torch.tensor(values[start : start + batch_size]).shape[0])
    del frame, values
    return rows


def run_raw_scan(directory: Path, batch_size: int, cast: bool = False) -> int:
    import pyarrow.dataset as pds
    import pyarrow.fs as pafs

    parquet = pds.ParquetFileFormat()
    local = pafs.LocalFileSystem()
    # The same scan settings as the connector's reader, minus the float32 projection.
    options = pds.ParquetFragmentScanOptions(
        use_buffered_stream=True, buffer_size=1 << 20, pre_buffer=False
    )
    rows = 0
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
            for batch in fragment.subset(row_group_ids=[row_group]).to_batches(
                columns=projection,
                batch_size=65_536,
                batch_readahead=4,
                fragment_scan_options=options,
                use_threads=True,
            ):
                rows += batch.num_rows
    return rows


def run_raw_cast(directory: Path, batch_size: int) -> int:
    return run_raw_scan(directory, batch_size, cast=True)


def run_raw_iter(directory: Path, batch_size: int) -> int:
    rows = 0
    for path in sorted(directory.glob("*.parquet")):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=65_536):
            rows += batch.num_rows
    return rows


Runs = dict[str, dict[str, list[float]]]


def throughput(directory: Path, rows: int, batch_size: int, rounds: int) -> Runs:
    """Wall and CPU seconds (all threads of this process) of every path, rounds interleaved."""
    paths: dict[str, Callable[[Path, int], int]] = {
        "ours": run_ours,
        "naive": run_naive,
        "raw_scan": run_raw_scan,
        "raw_iter": run_raw_iter,
        "raw_cast": run_raw_cast,
    }
    times: Runs = {"wall": {name: [] for name in paths}, "cpu": {name: [] for name in paths}}
    for round_index in range(rounds):
        for name, run in paths.items():
            if name == "naive" and round_index >= NAIVE_ROUNDS:
                continue  # 10-30x slower than the rest: a few runs bound its best time well
            warm(directory)
            gc.collect()
            start, start_cpu = time.perf_counter(), time.process_time()
            seen = run(directory, batch_size)
            elapsed, cpu = time.perf_counter() - start, time.process_time() - start_cpu
            if seen != rows:
                raise AssertionError(f"{name} saw {seen} rows, expected {rows}")
            times["wall"][name].append(elapsed)
            times["cpu"][name].append(cpu)
            print(
                f"  round {round_index + 1}/{rounds} {name:9s} {elapsed:7.3f} s wall "
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


def report(
    args: argparse.Namespace,
    data_bytes: int,
    times: Runs,
    mem: dict[str, dict[str, Any]],
    machine_line: str,
    wall_s: float,
) -> str:
    rows = args.rows
    wall, cpu = times["wall"], times["cpu"]
    best = {name: min(values) for name, values in wall.items()}
    best_cpu = {name: min(values) for name, values in cpu.items()}
    raw_name = min(("raw_scan", "raw_iter"), key=lambda name: best[name])
    raw_cpu_name = min(("raw_scan", "raw_iter"), key=lambda name: best_cpu[name])
    rate = {name: rows / seconds for name, seconds in best.items()}
    rate_cpu = {name: rows / seconds for name, seconds in best_cpu.items()}
    vs_naive = rate["ours"] / rate["naive"]
    vs_raw = rate["ours"] / rate[raw_name]
    vs_naive_cpu = rate_cpu["ours"] / rate_cpu["naive"]
    vs_raw_cpu = rate_cpu["ours"] / rate_cpu[raw_cpu_name]
    vs_cast = rate["ours"] / rate["raw_cast"]
    vs_cast_cpu = rate_cpu["ours"] / rate_cpu["raw_cast"]
    mem_ratio = mem["naive"]["peak_mib"] / mem["ours"]["peak_mib"]

    def verdict(value: float, target: float) -> str:
        return "met" if value >= target else "MISSED"

    lines = [
        "| measurement | ours | naive | raw read ceiling | ratio | target | |",
        "|---|---:|---:|---:|---:|---:|---|",
        (
            f"| (a) rows/s into torch batches (wall, best of {args.rounds}; naive "
            f"{min(args.rounds, NAIVE_ROUNDS)}) | "
            f"{rate['ours'] / 1e6:.2f} M | {rate['naive'] / 1e6:.2f} M | "
            f"{rate[raw_name] / 1e6:.2f} M ({raw_name}) | {vs_naive:.1f}x naive; "
            f"{vs_raw:.0%} of ceiling | >= {TARGET_NAIVE:.0f}x; >= {TARGET_CEILING:.0%} | "
            f"{verdict(vs_naive, TARGET_NAIVE)}; {verdict(vs_raw, TARGET_CEILING)} |"
        ),
        (
            f"| (a) rows per CPU-second (all threads, same runs) | "
            f"{rate_cpu['ours'] / 1e6:.2f} M | {rate_cpu['naive'] / 1e6:.2f} M | "
            f"{rate_cpu[raw_cpu_name] / 1e6:.2f} M ({raw_cpu_name}) | "
            f"{vs_naive_cpu:.1f}x naive; {vs_raw_cpu:.0%} of ceiling | same | "
            f"{verdict(vs_naive_cpu, TARGET_NAIVE)}; {verdict(vs_raw_cpu, TARGET_CEILING)} |"
        ),
        (
            f"| (a) ours / the read + float32 cast alone (raw_cast), wall; cpu | "
            f"| | {rate['raw_cast'] / 1e6:.2f} M | {vs_cast:.0%}; {vs_cast_cpu:.0%} | | info |"
        ),
        (
            f"| (b) peak RSS building the xgboost matrix | {mem['ours']['peak_mib']:.0f} MiB | "
            f"{mem['naive']['peak_mib']:.0f} MiB | | {mem_ratio:.1f}x lower | "
            f">= {TARGET_MEMORY}x | {verdict(mem_ratio, TARGET_MEMORY)} |"
        ),
    ]
    detail = [
        "| path | best wall s | median wall s | best cpu s | wall s, each run |",
        "|---|---:|---:|---:|---|",
    ]
    for name in ("ours", "naive", "raw_scan", "raw_iter", "raw_cast"):
        runs = ", ".join(f"{t:.3f}" for t in wall[name])
        detail.append(
            f"| {name} | {best[name]:.3f} | {statistics.median(wall[name]):.3f} | "
            f"{best_cpu[name]:.3f} | {runs} |"
        )
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
    summary = "\n".join(lines)
    print()
    print(summary)
    print()
    print("\n".join(detail))
    print()
    print("\n".join(detail_mem))
    return "\n".join(
        [
            "## Data connector (flow_sdk.data)",
            "",
            "Command: `python bench/data.py`"
            + (f" (run as `{' '.join(sys.argv)}`)" if len(sys.argv) > 1 else ""),
            "",
            (
                f"Data: {rows:,} rows x {args.cols} float64 features + int64 label in "
                f"{args.files} parquet files (snappy), row groups of {args.row_group_rows:,} rows; "
                f"{data_bytes / 2**30:.2f} GiB as Arrow in memory. Torch batch size "
                f"{args.batch_size}. Machine: {machine_line}. Whole run {wall_s:.0f} s."
            ),
            "",
            summary,
            "",
            "Runs of (a), interleaved, page cache warmed before each:",
            "",
            *detail,
            "",
            "(b), each child a fresh process:",
            "",
            *detail_mem,
            "",
            NOTES,
        ]
    )


NOTES = """\
Notes:

- How our path reads: one row group per scan through `pyarrow.dataset`, streamed through 1 MiB
  buffers, with the float64 -> float32 cast as a scan projection (evaluated per batch on
  Arrow's threads); then numpy views of the float32 buffers and `torch.from_numpy`, and torch
  batches are `torch.split` views of each read batch. Profiling an earlier version found
  `ParquetFile.iter_batches` over a whole file pre-buffering the file (about 1.2 GiB of Arrow
  memory here) and the per-column cast on the Python thread; both were replaced.
- Why (a) stays below the raw read ceiling: the ceiling only decodes (for this plain-encoded,
  incompressible float64 data that is little more than a copy), while our path must also
  write every value once more as float32 (the lean cast: a second pass over about 1.1 GiB,
  about as much memory traffic as the decode itself) and hand each batch to Python (numpy
  views, `torch.from_numpy`, `torch.split`). `raw_cast` is that cast alone with nothing else:
  ours against it shows what our Python side costs; raw against raw_cast shows the cast.
  No copy is left to remove: the float32 buffers reach torch as they are (the tests check
  the pointers). Opting out with `cast_float64=False` skips the cast and the float32 halving.
- (b) Our peak is about the QuantileDMatrix itself (xgboost alone needs about 430-480 MiB
  to build one of this shape from float32 numpy batches) plus a few read batches; the naive
  path holds the Arrow table, the pandas frame and the DMatrix's own copy. Build time is
  dominated by xgboost's quantile sketch (QuantileDMatrix from numpy takes about as long);
  the iterator reads the parquet data once per xgboost pass (4 passes).
- The machine is shared and its load varies (see the load average above): wall times of the
  same path differ by 2-5x between rounds. Rounds are interleaved and the best run of each
  path is compared; CPU seconds (all threads of the process) are less sensitive to other
  processes but still move with cache and memory-bandwidth contention.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=6_000_000)
    parser.add_argument("--cols", type=int, default=24)
    parser.add_argument("--files", type=int, default=3)
    parser.add_argument("--row-group-rows", type=int, default=500_000)
    parser.add_argument("--batch-size", type=int, default=4_096)
    parser.add_argument("--rounds", type=int, default=5)
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
            generate(directory, args.rows, args.cols, args.files, args.row_group_rows)
        data_bytes = (args.cols + 1) * 8 * args.rows
        print("(a) rows/s into torch batches", flush=True)
        times = throughput(directory, args.rows, args.batch_size, args.rounds)
        print("(b) peak RSS building the xgboost training matrix", flush=True)
        mem = memory(directory, args.cols)
        print(report(args, data_bytes, times, mem, machine_line, time.perf_counter() - started))
    finally:
        if owned:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
