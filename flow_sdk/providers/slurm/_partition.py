"""The partition a provider's jobs go to, as the controller shows it (``scontrol show
partition``, ``sinfo``), and what it can never run, found before anything is submitted: more
nodes than it has, a time limit above its ``MaxTime`` or none at all, a GPU type none of its
nodes has, more GPUs per node than any has. Slurm itself would queue such a job for ever
where the site does not enforce the partition's limits at submission."""

from __future__ import annotations

from collections.abc import Mapping

from flow_sdk.errors import FieldProblem, ProviderError
from flow_sdk.providers.slurm import _batch
from flow_sdk.providers.slurm._commands import Cluster, minutes, parse_records
from flow_sdk.spec import TaskSpec
from flow_sdk.wire.runtimecap import SCHEDULER


class Partition:
    """The configured partition (``name``), or the cluster's default one (None)."""

    def __init__(self, cluster: Cluster, name: str | None) -> None:
        self.cluster, self.name = cluster, name

    @property
    def where(self) -> str:
        return f"partition {self.name}" if self.name else "the default partition"

    def _only(self) -> list[str]:
        return ["-p", self.name] if self.name else []

    def record(self) -> dict[str, str]:
        """The partition as ``scontrol show partition`` shows it."""
        records = parse_records(self.cluster.run(
            ["scontrol", "-o", "show", "partition", *([self.name] if self.name else [])]))
        if self.name is None:
            records = [r for r in records if r.get("Default") == "YES"] or records[:1]
        if not records:
            raise ProviderError(f"slurm: the cluster has no {self.where}; name one it has in "
                                "provider_config['partition'] (see `sinfo`)")
        return records[0]

    def gpus(self) -> dict[str, int]:
        """The GPU types the partition's nodes have (``gpu:TYPE:COUNT`` GRES; "" for GPUs of
        no named type), each with the most one node has."""
        output = self.cluster.run(["sinfo", "-h", "-N", *self._only(), "-o", "%G"])
        most: dict[str, int] = {}
        for gres in ",".join(output.split()).split(","):
            parts = gres.split("(")[0].split(":")
            if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
                kind = parts[1] if len(parts) == 3 else ""
                most[kind] = max(most.get(kind, 0), int(parts[-1]))
        return most

    def idle_nodes(self) -> int:
        output = self.cluster.run(["sinfo", "-h", *self._only(), "-o", "%D|%T"])
        return sum(int(count) for count, state in (line.split("|") for line in
                                                   output.split() if "|" in line)
                   if state == "idle")

    def problems(self, spec: TaskSpec, gpus_per_node: str | None) -> list[FieldProblem]:
        """Everything the partition can never run of ``spec``, at once, each with its fix."""
        problems: list[FieldProblem] = []
        record, where = self.record(), self.where
        total = int(record.get("TotalNodes", "0") or 0)
        if spec.num_instances > total:
            problems.append(FieldProblem(
                "num_instances", f"{where} has {total} node(s), fewer than the "
                f"{spec.num_instances} asked; ask for at most {total} or name another "
                "partition in provider_config['partition']"))
        max_minutes = minutes(record.get("MaxTime", "UNLIMITED"))
        if spec.max_run_time_hours is None and default_minutes(record) is None:
            problems.append(FieldProblem(
                "max_run_time_hours", "the slurm provider needs a time limit for the job and "
                f"{where} sets none (no DefaultTime or MaxTime); give max_run_time_hours="))
        elif spec.max_run_time_hours is not None and max_minutes is not None:
            needed = _batch.time_limit_minutes(spec.max_run_time_hours)
            if needed > max_minutes:
                most = (max_minutes - SCHEDULER.grace_minutes()) / 60
                problems.append(FieldProblem(
                    "max_run_time_hours", f"{where} runs a job for at most {max_minutes} min "
                    f"(MaxTime), and this cap needs {needed} min with the scheduler's grace; "
                    f"give at most {most:.2f}"))
        if gpus_per_node is not None:
            kind, _, count = gpus_per_node.rpartition(":")
            problems += self._gpu_problems(kind, int(count))
        return problems

    def _gpu_problems(self, kind: str, count: int) -> list[FieldProblem]:
        gpus, where = self.gpus(), self.where
        if not gpus:
            return [FieldProblem("gpu", f"{where} has no GPUs; drop gpu=, or name a partition "
                                 "with GPUs in provider_config['partition']")]
        if kind and kind not in gpus:
            named = sorted(k for k in gpus if k)
            has = f"GPUs of type {', '.join(named)}" if named else "GPUs of no named type"
            return [FieldProblem("gpu", f"{where} has {has}, not {kind}; ask for one of those, "
                                 "or map the model to the cluster's GRES type in "
                                 "provider_config['gpu_types']")]
        most = gpus[kind] if kind else max(gpus.values())
        if count > most:
            return [FieldProblem("gpu", f"no node of {where} has {count} GPUs"
                                 f"{f' of type {kind}' if kind else ''}: {most} at most; ask "
                                 f"for at most {most} per node (num_instances= for more "
                                 "nodes)")]
        return []


def default_minutes(record: Mapping[str, str]) -> int | None:
    """A partition's time limit for a job that gives none: DefaultTime, else MaxTime."""
    return minutes(record.get("DefaultTime", "NONE")) or minutes(
        record.get("MaxTime", "UNLIMITED"))


def price_problems(spec: TaskSpec, usd_per_node_hour: float | None) -> list[FieldProblem]:
    """A price cap needs what a node-hour costs (the config names it), and that under it."""
    cap = spec.max_price_per_hour
    if cap is None:
        return []
    if usd_per_node_hour is None:
        return [FieldProblem("max_price_per_hour", "the slurm provider knows no price: name "
                             "what a node-hour costs in provider_config['usd_per_node_hour'], "
                             "or drop max_price_per_hour")]
    if usd_per_node_hour > cap:
        return [FieldProblem("max_price_per_hour", f"a node-hour here costs "
                             f"${usd_per_node_hour:,.2f} (provider_config"
                             f"['usd_per_node_hour']), above the cap of ${cap:,.2f}; raise "
                             "the cap or drop it")]
    return []
