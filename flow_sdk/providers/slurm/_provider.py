"""The Slurm provider: a task is one batch job on a Slurm cluster; each node of the job runs
one node agent; the task's objects and logs live in the file store on the cluster's shared
filesystem (``shared_dir``), which every node sees.

Run it where Slurm's commands are (a login node), or from another machine with ``login``:
then every command and every file of ``shared_dir`` goes through one SSH connection to the
login node (``sshhost.SshHost``), and the nodes get the config without it.

A launch ships the SDK's wheel (and a plug-in's) into the store by digest, writes the node
bootstrap, the launch file and one 0600 boot file per node under ``shared_dir``, and submits
the batch script (``_batch``). A job is all or nothing: Slurm starts every node of it or
none, so a launch never leaves half a gang.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from flow_sdk.errors import FieldProblem, ProviderError
from flow_sdk.providers.base import (
    Instance,
    InstanceState,
    LaunchPlan,
    LaunchRequest,
    LogStore,
    ObjectStore,
    Provider,
    SchedulerEnd,
    Volumes,
    boot_stream,
)
from flow_sdk.providers.dirvolumes import DirectoryVolumes
from flow_sdk.providers.gcreport import GcReport
from flow_sdk.providers.capabilities import Capabilities, Support
from flow_sdk.providers.files import FileLogStore, FileObjectStore
from flow_sdk.providers.host import LOCAL, Host
from flow_sdk.providers.launch import NodeLaunch, node_launch, ship_wheels
from flow_sdk.providers.slurm import _batch
from flow_sdk.providers.slurm._commands import (
    NAMED_JOB_FIELDS,
    Cluster,
    JobState,
    parse_named_squeue,
    parse_sbatch,
    waiting,
)
from flow_sdk.providers.slurm._jobs import CANCEL_GRACE_S, Jobs
from flow_sdk.providers.slurm._partition import Partition, default_minutes, price_problems
from flow_sdk.providers.slurm._settings import SlurmSettings
from flow_sdk.providers import sshhost
from flow_sdk.spec import TaskSpec
from flow_sdk.system import procs

BOOT_SCRIPT = Path(__file__).with_name("boot.py")
OUTPUT_TAIL = 10  # lines of a job's Slurm output that a task's error shows


class SlurmProvider(Provider):
    name: ClassVar[str] = "slurm"
    capabilities: ClassVar[Capabilities] = Capabilities(
        file_volumes=Support.HONOURED, s3_mounts=Support.HONOURED, interconnect=Support.NOTED,
        # price caps: held against usd_per_node_hour where the config names it (check)
        pools=Support.HONOURED, price_caps=Support.HONOURED,
        notes={"interconnect": "the cluster's own fabric carries the traffic between nodes "
                               "(its administrators chose it)"})

    def __init__(self, settings: SlurmSettings, cluster: Cluster | None = None) -> None:
        self.settings = settings
        self.host: Host = LOCAL if settings.login is None else sshhost.connect(
            settings.login, settings.python, settings.ssh_config)
        self.root = Path(settings.shared_dir)
        if settings.shared_dir.startswith("~"):  # the home of the machine the commands run on
            self.root = Path(self.host.home()) / Path(settings.shared_dir).relative_to("~")
        self.cluster = cluster or Cluster(self.host, settings.login)
        self.jobs = Jobs(self.cluster)
        self.partition = Partition(self.cluster, settings.options.partition)
        self._store = FileObjectStore(self.root / "store", self.host)
        self._logs = FileLogStore(self.root / "logs", self.host)
        # file volumes: folders on the shared filesystem, each node's S3 caches its own
        self._volumes = DirectoryVolumes(self, self.root, self.root / "jobs", host=self.host)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> SlurmProvider:
        return cls(SlurmSettings.parse(config))

    def config(self) -> dict[str, Any]:
        return {**self.settings.to_config(), "shared_dir": str(self.root)}

    def node_config(self) -> dict[str, Any]:
        """The nodes run Slurm's commands and see ``shared_dir`` themselves: no login."""
        config = self.config()
        for key in ("login", "ssh_config"):
            config.pop(key, None)
        return config

    @property
    def store(self) -> ObjectStore:
        return self._store

    @property
    def logs(self) -> LogStore:
        return self._logs

    @property
    def volumes(self) -> Volumes:
        return self._volumes

    # -- before launch -----------------------------------------------------------------------

    def check(self, spec: TaskSpec) -> list[FieldProblem]:
        """What the partition can never run, found before anything is submitted (Slurm
        itself would queue such a job for ever where limits are not enforced at submission):
        ``_partition.problems``; and a price cap this provider cannot hold."""
        return self.partition.problems(spec, self.gpus_per_node(spec)) + price_problems(
            spec, self.settings.usd_per_node_hour)

    def notes(self, spec: TaskSpec) -> list[str]:
        notes = super().notes(spec)
        if spec.priority == "high" and "high" not in self.settings.options.priority_qos:
            notes.append("priority='high' runs at the cluster's default priority: raising a "
                         "job's priority takes a QoS the site grants; name it in "
                         "provider_config['priority_qos']['high']")
        return notes

    def plan(self, spec: TaskSpec) -> LaunchPlan:
        record, where = self.partition.record(), self.partition.where
        return LaunchPlan(self.name, self.gpus_per_node(spec) or "cpu", where, "slurm",
                          self._price, spec.num_instances,
                          spec.max_run_time_hours, workers_per_node=spec.slots_per_node,
                          summary=f"slurm: one job of {spec.num_instances} node(s) on "
                                  f"{where} ({self.partition.idle_nodes()} of "
                                  f"{record.get('TotalNodes', '?')} idle, MaxTime "
                                  f"{record.get('MaxTime', '?')}), time limit "
                                  f"{self._time_minutes(spec, record)} min; objects under "
                                  f"{self.root}",
                          price_source="provider_config['usd_per_node_hour']")

    def rendezvous_ports(self) -> tuple[int, int]:
        """Drawn per task: jobs of several tasks may share a node."""
        return procs.free_port(), procs.free_port()

    def _time_minutes(self, spec: TaskSpec, partition: dict[str, str] | None = None
                      ) -> int | None:
        """``--time``: from the cap, else the partition's limit (read here unless given)."""
        if spec.max_run_time_hours is not None:
            return _batch.time_limit_minutes(spec.max_run_time_hours)
        return default_minutes(partition if partition is not None else self.partition.record())

    def gpus_per_node(self, spec: TaskSpec) -> str | None:
        """``--gpus-per-node``: the GRES type ``gpu_types`` maps the model to (else the
        model's own name) and the count; the count alone for ``any``."""
        if spec.gpu is None:
            return None
        model = spec.gpu.model.lower()
        if model in ("any", "gpu"):
            return str(spec.gpu.count)
        return f"{self.settings.gpu_types.get(model, model)}:{spec.gpu.count}"

    # -- nodes -------------------------------------------------------------------------------

    def _job_dir(self, task_id: str) -> Path:
        return self.root / "jobs" / task_id

    @property
    def _price(self) -> float:
        """USD per node-hour, as the config names it (0 where it names none)."""
        return self.settings.usd_per_node_hour or 0.0

    def _node(self, instance_id: str, task_id: str, address: str, state: InstanceState,
              launched_at: float, why: str = "") -> Instance:
        return Instance(instance_id, task_id, address, state, launched_at,
                        usd_per_hour=self._price, market="slurm", instance_type="node",
                        waiting=why)

    def _nodes_dir(self, task_id: str) -> Path:
        """Where each node of the task has its working folder (named by its instance id)."""
        return self.root / "nodes" / task_id

    def _job(self, task_id: str) -> dict[str, Any] | None:
        """What the launch recorded of the task's job: its id, node count and launch time."""
        data = self.host.read(str(self._job_dir(task_id) / "job.json"))
        return json.loads(data) if data is not None else None

    def _job_id(self, task_id: str) -> str | None:
        job = self._job(task_id)
        return str(job["job_id"]) if job else None

    def launch(self, request: LaunchRequest) -> list[Instance]:
        spec, task_id = request.spec, request.task_id
        time_minutes = self._time_minutes(spec)
        if time_minutes is None:
            raise ProviderError(f"slurm: {self.partition.where} sets no time limit; give "
                                "max_run_time_hours=")
        self.host.mkdirs(str(self.root))
        launch = node_launch(request, ship_wheels(self._store, self.name))
        job_dir = self._job_dir(task_id)
        try:
            job_id = self._submit(request, launch, job_dir, time_minutes)
        except BaseException:  # nothing was queued: leave no boot file (the secret) behind
            self.host.remove(str(job_dir))
            raise
        now = time.time()
        self.host.write(str(job_dir / "job.json"), json.dumps(
            {"job_id": job_id, "nodes": spec.num_instances, "launched_at": now,
             "role": request.boot.role}).encode())
        return [self._node(_batch.instance_id(job_id, node), task_id, "", "pending", now)
                for node in range(spec.num_instances)]

    def _submit(self, request: LaunchRequest, launch: NodeLaunch, job_dir: Path,
                time_minutes: int) -> str:
        """Write the job's boot files, launch file and batch script; submit it; its id."""
        spec, task_id = request.spec, request.task_id
        for node in range(spec.num_instances):  # each agent reads and removes its own
            self.host.write(str(job_dir / "boot" / f"{node}.json"),
                            launch.boot_text().encode(), "new")
        wheels = [{"path": str(self._store.root / w.key), "sha256": w.sha256,
                   "filename": w.filename} for w in launch.wheels]
        launch_file = job_dir / "launch.json"
        self.host.write(str(launch_file), _batch.render_launch_file(
            launch, task_id=task_id, wheels=wheels, envs=self.root / "envs",
            boot_files=job_dir / "boot", nodes_dir=self._nodes_dir(task_id),
            boot_log=str(self._logs.stream_path(task_id, boot_stream("{instance}")))).encode())
        script = job_dir / "batch.sh"
        self.host.write(str(script), _batch.render_batch_script(
            launch, task_id=task_id, nodes=spec.num_instances, time_minutes=time_minutes,
            gpus_per_node=self.gpus_per_node(spec), options=self.settings.options,
            python=self.settings.python, boot_script=self._boot_script(),
            launch_file=launch_file, output=job_dir / "slurm-%j.out",
            min_nodes=spec.min_instances, priority=spec.priority, spares=spec.spares,
            warn_before_s=None if request.boot.role == "pool" else _batch.warn_before_s(
                time_minutes)
        ).encode())
        return parse_sbatch(self.cluster.run(["sbatch", "--parsable", str(script)]))

    def _boot_script(self) -> Path:
        """The node bootstrap on the shared filesystem, by digest (what the nodes run)."""
        data = BOOT_SCRIPT.read_bytes()
        path = self.root / "boot" / f"{hashlib.sha256(data).hexdigest()[:16]}.py"
        if self.host.kind(str(path)) is None:
            self.host.write(str(path), data)
        return path

    def job_state(self, task_id: str) -> JobState | None:
        """The task's job as the controller reports it; None when Slurm does not know it."""
        job_id = self._job_id(task_id)
        return self.jobs.state(job_id) if job_id is not None else None

    def list_instances(self, task_id: str) -> list[Instance]:
        recorded = self._job(task_id)
        if recorded is None:
            return []
        job_id, count, launched = str(recorded["job_id"]), recorded["nodes"], recorded[
            "launched_at"]
        job = self.jobs.state(job_id)  # job.json read once a poll (over SSH, one round trip)
        if job is None or job.over:
            return [self._node(_batch.instance_id(job_id, k), task_id, "", "terminated",
                               launched) for k in range(count)]
        if not (job.running or job.state == "COMPLETING") or not job.nodes:
            why = waiting(job)
            return [self._node(_batch.instance_id(job_id, k), task_id, "", "pending",
                               launched, why) for k in range(count)]
        given = self.jobs.nodes(job.nodes)  # (name, NodeAddr) in the job's node order
        # with min_instances Slurm may give the job fewer nodes: the others never come
        return [self._node(_batch.instance_id(job_id, k), task_id,
                           given[k][1] if k < len(given) else "",
                           "running" if k < len(given) else "terminated", launched)
                for k in range(max(count, len(given)))]

    def scheduler_end(self, task_id: str) -> SchedulerEnd | None:
        """What Slurm says ended the job (``Jobs.ended_by``) and, unless someone cancelled it,
        the end of Slurm's own output of it (a node that could not even start the bootstrap,
        an interpreter missing there, shows only there). Slurm opens that output on the job's
        first node as it starts: a job that FAILED without one may not have seen
        ``shared_dir``."""
        job_id = self._job_id(task_id)
        end = self.jobs.ended_by(job_id) if job_id is not None else None
        if end is None or end.cancelled:
            return end
        output = self._job_dir(task_id) / f"slurm-{job_id}.out"
        data = self.host.read(str(output))
        if data is None and " ended FAILED" in end.message:
            return SchedulerEnd(f"{end.message}; the job wrote no output to {output}: its "
                                f"nodes may not see {self.root}. shared_dir must be a folder "
                                "of the filesystem every node mounts, at the same path")
        lines = data.decode(errors="replace").splitlines()[-OUTPUT_TAIL:] if data else []
        return SchedulerEnd(end.message + (f"; the end of Slurm's output of the job ({output}):"
                                           "\n  " + "\n  ".join(lines) if lines else ""))

    def shell_command(self, task_id: str, instance_id: str, command: str | None
                      ) -> list[str] | None:
        """An ``srun`` step in the task's running job on that node (``--overlap``: beside
        its agent, in its allocation), in the node's working folder, with the caller's
        environment as Slurm passes it: a login shell on a pty, or ``command`` under
        ``bash -c``."""
        job = self.job_state(task_id)
        if job is None or not job.running:
            raise ProviderError(f"slurm: task {task_id} has no running job to open a shell in")
        given = self.jobs.nodes(job.nodes)
        node = next((k for k in range(len(given))
                     if _batch.instance_id(job.job_id, k) == instance_id), None)
        if node is None:
            raise ProviderError(f"slurm: job {job.job_id} of task {task_id} has no node "
                                f"{instance_id}")
        step = ["srun", f"--jobid={job.job_id}", "--overlap", f"--nodelist={given[node][0]}",
                "--nodes=1", "--ntasks=1", f"--chdir={self._nodes_dir(task_id) / instance_id}"]
        step += ["--pty", "bash", "-l"] if command is None else ["bash", "-c", command]
        return step if self.settings.login is None else self.host.command(
            step, tty=command is None)

    def terminate(self, task_id: str) -> None:
        """A task's job first has ``CANCEL_GRACE_S`` to end by itself (``Jobs.cancel``); a
        pool's daemons stop only when told, so its job is cancelled at once."""
        job = self._job(task_id)
        if job is not None:
            self.jobs.cancel(task_id, str(job["job_id"]), 0.0 if job.get("role") == "pool"
                             else CANCEL_GRACE_S)
        self.host.remove(str(self._job_dir(task_id) / "boot"))  # secrets

    def gc(self, *, dry_run: bool = False, ended: Mapping[str, str] | None = None
           ) -> GcReport:
        """Cancel the jobs of the tasks ``ended`` names (``flow_sdk.lifecycle`` judged them
        ended). One ``squeue`` of this user's jobs finds ours by their name and comment, so
        a job whose launcher died before it recorded the job id is found too; the jobs of
        other tasks live, and jobs that are not ours are never touched."""
        report = GcReport(self.name, dry_run)
        listed = parse_named_squeue(self.cluster.run(
            ["squeue", "-h", "--me", "-o", NAMED_JOB_FIELDS]))
        for job, name, comment in listed:
            task_id = comment.removeprefix(_batch.COMMENT_PREFIX)
            if not (comment.startswith(_batch.COMMENT_PREFIX) and name == _batch.job_name(
                    task_id)) or not job.active:
                continue
            why = (ended or {}).get(task_id)
            if why is None:
                report.live_tasks.append(task_id)
                continue
            report.reasons[task_id] = why
            report.terminated_instances.append(f"job {job.job_id}")
            if not dry_run:
                self.jobs.cancel(task_id, job.job_id)
        return report
