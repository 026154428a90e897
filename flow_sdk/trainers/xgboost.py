"""Distributed XGBoost on flow nodes: ``XGBEstimator`` and ``XGBScalingConfig``.

    from flow_sdk.data import ShardedDataConnector
    from flow_sdk.trainers.xgboost import XGBEstimator, XGBScalingConfig

    estimator = XGBEstimator(
        params={"objective": "reg:squarederror", "tree_method": "hist", "max_depth": 6},
        num_boost_round=200,
        scaling_config=XGBScalingConfig(num_workers=4, num_cpu_per_worker=8),
    )
    booster = estimator.fit(ShardedDataConnector.from_parquet("s3://bucket/train/"),
                            input_cols=["age", "income"], label_col="risk",
                            eval_set=ShardedDataConnector.from_parquet("s3://bucket/eval/"),
                            verbose_eval=10)
    estimator.predict(eval_df)          # on this machine, with the trained booster

Inside a ``run_on="head"`` job (see ``flow_sdk.node.headjob``), ``fit`` trains on the job's own
workers (all of them with ``num_workers=-1``) instead of launching a task. Elsewhere:
``fit`` launches one task of ``num_workers`` nodes (1 for -1) with one worker each
(``distributed_mode="auto"``, so every worker has ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/
``MASTER_PORT``). Rank 0 hosts XGBoost's ``RabitTracker`` on the leader; every worker joins
XGBoost's own collective with XGBoost's rank equal to its flow rank (see ``_collective``).
Each worker reads its shard of the data (``get_shard(rank, world_size)``: whole parquet row
groups, balanced by row count) through an ``xgboost.DataIter`` over Arrow batches (float32, no
pandas), builds a ``QuantileDMatrix`` (``ExtMemQuantileDMatrix`` with
``external_memory=True``), drops the loader and trains with ``xgboost.train``. Histograms are
all-reduced across workers, so the model is the one a single process would grow from the
same bins; evaluation metrics are reduced over every worker's eval shard. Rank 0 returns
the model, which ``fit`` loads into an ``xgboost.Booster`` on this machine.

xgboost is imported only inside ``fit``/``predict``/``get_booster`` and on the nodes.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flow_sdk.node import headjob
from flow_sdk.client.app import FlowApp, RemoteFunction
from flow_sdk.spec import MAX_INSTANCES
from flow_sdk.trainers._collective import CollectiveConfig, xgboost_collective
from flow_sdk.trainers._common import (
    DEFAULT_GPU_TYPE,
    Place,
    TrainerError,
    as_sharded,
    check_bool,
    check_int,
    declare,
    launch_options,
    problem,
    wait_for_results,
)

if TYPE_CHECKING:
    import numpy as np
    import xgboost

    from flow_sdk.data import DataConnector, ShardedDataConnector
    from flow_sdk.client.task import Task

__all__ = ["XGBEstimator", "XGBScalingConfig"]

DEFAULT_BATCH_ROWS = 262_144
DEFAULT_BOOTSTRAP_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class XGBScalingConfig:
    """How many workers train and what each one gets.

    ``num_workers``: XGBoost workers; -1 (the default) means "what the cluster has": every
    worker of the ``run_on="head"`` job ``fit`` is called in, and one node outside any job.
    Outside a job each worker is a node of its own. ``num_cpu_per_worker``: XGBoost threads
    per worker (``nthread``); -1 or ``None`` uses the worker's share of its node's cores.
    ``use_gpu``: each node gets one GPU (of the estimator's ``gpu_type``) and XGBoost trains
    with ``device="cuda"``. Invalid values raise ``flow_sdk.ValidationError`` naming the
    field, here, before anything is launched.
    """

    num_workers: int = -1
    num_cpu_per_worker: int | None = -1
    use_gpu: bool = False

    def __post_init__(self) -> None:
        if self.num_workers != -1:
            check_int(self.num_workers, "scaling_config.num_workers", minimum=1,
                      maximum=MAX_INSTANCES)
        if self.num_cpu_per_worker not in (None, -1):
            check_int(self.num_cpu_per_worker, "scaling_config.num_cpu_per_worker", minimum=1)
        check_bool(self.use_gpu, "scaling_config.use_gpu")

    @property
    def nodes_outside_a_job(self) -> int:
        """Nodes ``fit`` launches when it is not called inside a job."""
        return max(1, self.num_workers)


@dataclass(frozen=True)
class _FitJob:
    """Everything a worker needs, pickled into the task's payload."""

    params: dict[str, Any]
    num_boost_round: int
    dataset: ShardedDataConnector
    input_cols: list[str]
    label_col: str
    eval_set: ShardedDataConnector | None
    verbose_eval: bool | int
    external_memory: bool
    batch_size: int
    bootstrap_timeout_s: float


def _build_matrices(job: _FitJob, rank: int, world_size: int, cache_dir: str | None
                    ) -> tuple[xgboost.DMatrix, xgboost.DMatrix | None, dict[str, Any]]:
    """This worker's training (and evaluation) matrix from its shards, loaders dropped.
    ``cache_dir``: where external-memory pages go (``None`` builds in-memory matrices)."""
    from flow_sdk.data import build_quantile_dmatrix

    options: dict[str, Any] = {"external_memory": cache_dir is not None, "cache_dir": cache_dir,
                               "batch_size": job.batch_size,
                               "max_bin": job.params.get("max_bin"),
                               "nthread": job.params.get("nthread")}
    started = time.perf_counter()
    shard = job.dataset.get_shard(rank, world_size)
    info: dict[str, Any] = {"train_rows": shard.num_rows, "eval_rows": 0}
    dtrain = build_quantile_dmatrix(shard, job.input_cols, job.label_col, **options)
    del shard
    info["matrix"] = type(dtrain).__name__
    deval = None
    if job.eval_set is not None:
        eval_shard = job.eval_set.get_shard(rank, world_size)
        info["eval_rows"] = eval_shard.num_rows
        deval = build_quantile_dmatrix(eval_shard, job.input_cols, job.label_col, ref=dtrain,
                                       **options)
        del eval_shard
    gc.collect()  # the loaders and their Arrow batches go before training starts
    info["build_s"] = time.perf_counter() - started
    return dtrain, deval, info


def _train(job: _FitJob, rank: int, world_size: int) -> dict[str, Any]:
    """Build this worker's matrices and train; rank 0's result carries the model."""
    import xgboost

    cache_dir = tempfile.mkdtemp(prefix="flow-xgb-extmem-") if job.external_memory else None
    try:
        dtrain, deval, info = _build_matrices(job, rank, world_size, cache_dir)
        evals = [(dtrain, "train")] + ([(deval, "valid")] if deval is not None else [])
        evals_result: dict[str, dict[str, list[float]]] = {}
        started = time.perf_counter()
        from flow_sdk.data import default_nthread  # nthread: this worker's share of the cores

        nthread = default_nthread()
        params = {**({"nthread": nthread} if nthread else {}), **job.params}
        booster = xgboost.train(params, dtrain, num_boost_round=job.num_boost_round,
                                evals=evals, evals_result=evals_result,
                                verbose_eval=job.verbose_eval)
        info.update(rank=rank, world_size=world_size, train_s=time.perf_counter() - started,
                    evals_result=evals_result)
        if rank == 0:
            info["model"] = bytes(booster.save_raw("ubj"))
        # xgboost deletes its page files when the matrices are freed; then the folder goes
        del booster, evals, dtrain, deval
        gc.collect()
    finally:
        if cache_dir is not None:
            shutil.rmtree(cache_dir, ignore_errors=True)
    return info


def _xgboost_fit(job: _FitJob) -> dict[str, Any]:
    """The task's function: join the collective (more than one worker), build, train."""
    place = Place.here()
    if place.world_size == 1:
        return {**_train(job, place.rank, place.world_size), "node": place.node_rank}
    config = CollectiveConfig(rank=place.rank, world_size=place.world_size,
                              leader_ip=place.main_ip,
                              exchange_port=int(os.environ["MASTER_PORT"]),
                              token=place.task_id or "flow-xgboost",
                              timeout_s=job.bootstrap_timeout_s)
    with xgboost_collective(config):
        return {**_train(job, place.rank, place.world_size), "node": place.node_rank}


class XGBEstimator:
    """Train an XGBoost model on ``scaling_config.num_workers`` nodes of a flow provider.

    ``params`` and ``num_boost_round`` are ``xgboost.train``'s (``n_estimators``, when given,
    sets ``num_boost_round``). ``external_memory=True``
    builds each worker's matrix as an ``ExtMemQuantileDMatrix`` (binned pages cached on the
    node's disk) for data larger than a node's memory; ``batch_size`` is the rows per Arrow
    batch handed to XGBoost. ``provider``/``provider_config`` pick where the nodes run
    (default: local processes). ``gpu_type`` is the GPU model each node gets with
    ``use_gpu``. ``function_options`` are further ``@app.function`` options (``volumes``,
    ``environment``, ``max_run_time_hours``, ``region``, ...); those the scaling config sets
    (``num_instances``, ``workers_per_node``, ``gpu``, ``distributed_mode``) are refused.
    ``timeout_s`` bounds the wait in ``fit`` (the task is cancelled when it passes);
    ``bootstrap_timeout_s`` bounds how long the workers may take to find each other.

    Every option is validated here: a bad one raises ``flow_sdk.ValidationError`` naming
    it, and nothing is launched.
    """

    def __init__(self, params: Mapping[str, Any] | None = None, num_boost_round: int = 100,
                 scaling_config: XGBScalingConfig | None = None, *,
                 n_estimators: int | None = None,
                 external_memory: bool = False, batch_size: int = DEFAULT_BATCH_ROWS,
                 provider: str = "local", provider_config: dict[str, Any] | None = None,
                 gpu_type: str = DEFAULT_GPU_TYPE,
                 function_options: Mapping[str, Any] | None = None,
                 timeout_s: float | None = None,
                 bootstrap_timeout_s: float = DEFAULT_BOOTSTRAP_TIMEOUT_S) -> None:
        if params is not None and not isinstance(params, Mapping):
            raise problem("params", f"must be a dict of xgboost parameters, got "
                                    f"{type(params).__name__}")
        self.params: dict[str, Any] = dict(params or {})
        if n_estimators is not None:  # Snowflake's (and scikit-learn's) name for the rounds
            num_boost_round = check_int(n_estimators, "n_estimators", minimum=1)
        self.num_boost_round = check_int(num_boost_round, "num_boost_round", minimum=1)
        if scaling_config is None:
            scaling_config = XGBScalingConfig()
        if not isinstance(scaling_config, XGBScalingConfig):
            raise problem("scaling_config", "must be an XGBScalingConfig, got "
                                            f"{type(scaling_config).__name__}")
        self.scaling_config = scaling_config
        self.external_memory = check_bool(external_memory, "external_memory")
        self.batch_size = check_int(batch_size, "batch_size", minimum=1)
        if timeout_s is not None and not timeout_s > 0:
            raise problem("timeout_s", f"must be a positive number of seconds, got {timeout_s!r}")
        if not bootstrap_timeout_s > 0:
            raise problem("bootstrap_timeout_s", "must be a positive number of seconds, got "
                                                 f"{bootstrap_timeout_s!r}")
        self.timeout_s = timeout_s
        self.bootstrap_timeout_s = float(bootstrap_timeout_s)
        derived: dict[str, Any] = {  # one worker per node (with one GPU under use_gpu)
            "num_instances": scaling_config.nodes_outside_a_job, "workers_per_node": 1,
            "distributed_mode": "auto",
            "gpu": f"{gpu_type}:1" if scaling_config.use_gpu else None}
        self._app = FlowApp("xgboost", provider=provider, provider_config=provider_config)
        self._remote: RemoteFunction[[_FitJob], dict[str, Any]] = declare(
            self._app, _xgboost_fit, launch_options(derived, function_options))
        self._booster: xgboost.Booster | None = None
        self._input_cols: list[str] | None = None
        self.evals_result: dict[str, dict[str, list[float]]] = {}
        self.worker_info: list[dict[str, Any]] = []
        self.task: Task | None = None

    def __repr__(self) -> str:
        return (f"XGBEstimator(num_boost_round={self.num_boost_round}, "
                f"scaling_config={self.scaling_config!r}, provider={self._app.default_provider!r})")

    def _worker_params(self) -> dict[str, Any]:
        params = dict(self.params)
        if self.scaling_config.num_cpu_per_worker not in (None, -1):
            params.setdefault("nthread", self.scaling_config.num_cpu_per_worker)
        if self.scaling_config.use_gpu:
            params.setdefault("device", "cuda")
        return params

    def fit(self, dataset: DataConnector | Any, input_cols: Sequence[str], label_col: str,
            eval_set: DataConnector | Any | None = None,
            verbose_eval: bool | int | None = None) -> xgboost.Booster:
        """Train on ``dataset`` and return the booster (also kept for :meth:`get_booster`).

        ``dataset`` and ``eval_set`` are ``DataConnector`` s (or ``ShardedDataConnector`` s,
        pyarrow tables, pandas frames); each worker reads its own shard of both, so the
        files behind a parquet connector must be readable at the same path on every node
        (local paths for the local provider, S3 otherwise). ``input_cols`` are the feature
        columns, ``label_col`` the target. The metric of every round is recorded in
        :attr:`evals_result` (``{"train": ...}``, plus ``"valid"`` with ``eval_set``);
        ``verbose_eval`` (``True`` or every N rounds) prints it, streaming the workers' log
        to this terminal. Per-worker rows and timings end up in :attr:`worker_info`.

        Checked before launch: the columns (``flow_sdk.data.ColumnNotFoundError``) and that
        every worker's shard has rows (``flow_sdk.ValidationError``).
        """
        from flow_sdk.data import ColumnNotFoundError

        pool = headjob.active()
        ranks = self._job_ranks(pool) if pool else []
        train = as_sharded(dataset, "dataset")
        evaluation = as_sharded(eval_set, "eval_set") if eval_set is not None else None
        if isinstance(input_cols, str) or not input_cols:
            raise problem("input_cols", "must be a non-empty list of column names")
        cols = [str(c) for c in input_cols]
        if label_col in cols:
            raise problem("label_col", f"{label_col!r} is also one of input_cols")
        for name, data in (("dataset", train), ("eval_set", evaluation)):
            if data is None:
                continue
            missing = [c for c in [*cols, label_col] if c not in data.column_names]
            if missing:
                raise ColumnNotFoundError(f"{name} has no column(s) {missing}; available: "
                                          f"{data.column_names}")
            _check_shards(data, name,
                          len(ranks) if pool else self.scaling_config.nodes_outside_a_job)
        job = _FitJob(params=self._worker_params(), num_boost_round=self.num_boost_round,
                      dataset=train, input_cols=cols, label_col=label_col,
                      eval_set=evaluation,
                      verbose_eval=verbose_eval if verbose_eval is not None else False,
                      external_memory=self.external_memory, batch_size=self.batch_size,
                      bootstrap_timeout_s=self.bootstrap_timeout_s)
        if pool:  # inside a run_on="head" job: on the job's own workers
            results = pool.run(_xgboost_fit, (job,), ranks)
        else:
            task = self._remote.spawn(job)
            self.task = task
            results = sorted(wait_for_results(task, self.timeout_s, stream=bool(verbose_eval)),
                             key=lambda r: int(r["rank"]))
        leader = results[0]
        booster = _load_booster(leader.pop("model"))
        self._booster = booster
        self._input_cols = cols
        self.evals_result = leader["evals_result"]
        self.worker_info = results
        return booster

    def _job_ranks(self, pool: headjob.HeadPool) -> list[int]:
        """The job ranks that train: all of them for ``num_workers=-1``, else the first
        ``num_workers``."""
        ranks = pool.ranks()
        wanted = self.scaling_config.num_workers
        if wanted == -1:
            return ranks
        if wanted > len(ranks):
            raise problem("scaling_config.num_workers",
                          f"asks for {wanted} workers but this job has {len(ranks)}; use -1 "
                          "for all of them or start the job with more nodes")
        return ranks[:wanted]

    def get_booster(self) -> xgboost.Booster:
        """The booster of the last :meth:`fit`."""
        if self._booster is None:
            raise TrainerError("this XGBEstimator has no model yet; call fit() first")
        return self._booster

    def predict(self, data: DataConnector | Any) -> np.ndarray:
        """Predictions of the trained booster, computed here (not distributed).

        ``data``: a ``DataConnector`` (read batch by batch, the ``input_cols`` of ``fit``), a
        pandas ``DataFrame`` (its ``input_cols`` are used when present), a numpy array of
        features in ``input_cols`` order, or an ``xgboost.DMatrix``.
        """
        import numpy as np
        import xgboost

        from flow_sdk.data import DataConnector, column_to_numpy

        booster = self.get_booster()
        cols = self._input_cols or []
        if isinstance(data, xgboost.DMatrix):
            return booster.predict(data)
        if isinstance(data, DataConnector):
            parts = []
            for batch in data.iter_batches(self.batch_size, columns=cols):
                matrix = np.empty((batch.num_rows, len(cols)), dtype=np.float32)
                for j, name in enumerate(cols):
                    matrix[:, j] = column_to_numpy(batch.column(name), cast_float64=True)[0]
                parts.append(booster.inplace_predict(matrix))
            if not parts:
                return np.empty((0,), dtype=np.float32)
            return np.concatenate(parts)
        columns = getattr(data, "columns", None)
        if columns is not None and all(c in columns for c in cols):
            data = data[cols]
        return booster.inplace_predict(data)


def _check_shards(data: ShardedDataConnector, name: str, workers: int) -> None:
    """Every worker must get rows (XGBoost cannot build a matrix from none); row counts
    come from metadata only."""
    counts = data.shard_row_counts(workers)
    if min(counts) == 0:
        raise problem(name, f"split {workers} ways it leaves {counts.count(0)} worker(s) without "
                            f"rows (rows per worker: {counts}); parquet is split by whole row "
                            "groups, so write it with more, smaller row groups or use fewer "
                            "workers")


def _load_booster(raw: bytes) -> xgboost.Booster:
    import xgboost

    booster = xgboost.Booster()
    booster.load_model(bytearray(raw))
    return booster
