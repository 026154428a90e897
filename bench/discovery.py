"""Discovery + rank assignment on the aws provider at scale: pushed membership vs describe.

    python bench/discovery.py [--sizes 8,256,1024] [--sample 4] [--out FILE]

For each gang size N, in moto (in-process ``mock_aws``; fake credentials, no network) the
provider launches N instances through its real launch path (one gang ``run_instances``) and
the launcher writes the gang's signed membership record once (every instance id and address,
as ``launch_task`` does). Then ``--sample`` nodes spread over the rank range each run, side by
side, both ways a node agent can learn its rank, with the provider rebuilt from the config
the user-data carries: read the signed task record and the payload from S3, then

- **record**: read the membership record (one GET, its MAC checked) and take the rank from
  the sorted instance ids (``rendezvous.from_record``), as the agent does first;
- **describe**: ``rendezvous.discover`` polling ``provider.list_instances`` (one paged
  ``describe_instances`` by task tag), the agent's fallback and the path before the record;

and write its node record. Every AWS API call is counted through botocore's ``before-call``
event on the node's own session. A naive discovery that asks about each peer
(``describe_instances(InstanceIds=[peer])``) is measured on one node per size.

Not every node is run at every size: a describe of 1,024 instances takes seconds in moto,
whose XML serializer dominates; each sampled node runs the full path both ways, and all of
them must agree on the membership. ``--sample 0`` runs every node.
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import shlex
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.update(
    {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
)
for _key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
    os.environ.pop(_key, None)

import boto3  # noqa: E402
from moto import mock_aws  # noqa: E402

from flow_sdk import wire  # noqa: E402
from flow_sdk.wire import signing  # noqa: E402
from flow_sdk.wire import (  # noqa: E402
    BootConfig,
    GangMember,
    MembershipRecord,
    NodePhase,
    NodeRecord,
    TaskRecord,
)
from flow_sdk.providers.aws import AwsProvider  # noqa: E402
from flow_sdk.providers.base import LaunchRequest  # noqa: E402
from flow_sdk.node.rendezvous import Membership, discover, from_record  # noqa: E402
from flow_sdk.spec import build_task_spec  # noqa: E402

REGION = "us-east-1"
_BOOT_LINE_RE = re.compile(r"^FLOW_BOOT_JSON=(.*)$", re.MULTILINE)


def boot_of(script: str) -> BootConfig:
    """The boot configuration a rendered user-data script starts the agent with."""
    match = _BOOT_LINE_RE.search(script)
    if match is None:
        raise SystemExit("the user-data has no FLOW_BOOT_JSON line")
    return BootConfig.decode(shlex.split(match.group(1))[0])


BUCKET = "flow-bench-discovery"
PAGE = 1000  # describe_instances MaxResults (AWS's maximum)
PATHS = ("describe", "record")
GRACE_S = 10.0  # the agent's MEMBERSHIP_GRACE_S
TARGET_SPEEDUP = 5.0  # record vs describe, median boot-to-rank at the largest size
TARGET_GANG_CALLS = 2  # API calls per node to learn the gang, with the record present


@dataclass(frozen=True)
class NodeRun:
    rank: int
    calls: Counter[str]  # every call from boot to rank
    gang_calls: int  # the calls that learned the gang (membership)
    http: int
    seconds: float
    ids: tuple[str, ...]
    leader: str


@dataclass(frozen=True)
class SizeResult:
    nodes: int
    runs: dict[str, list[NodeRun]]  # by path
    naive_calls: int
    naive_seconds: float
    launch_seconds: float
    record_seconds: float  # the launcher writing the membership record


@contextmanager
def counting_session() -> Iterator[tuple[boto3.session.Session, Counter[str], list[int]]]:
    session = boto3.session.Session()
    calls: Counter[str] = Counter()
    http = [0]

    def on_call(model: Any, **_: Any) -> None:
        calls[f"{model.service_model.service_name}.{model.name}"] += 1

    def on_send(**_: Any) -> None:
        http[0] += 1

    session.events.register("before-call", on_call)
    session.events.register("before-send", on_send)
    yield session, calls, http


def run_size(n: int, sample: int) -> SizeResult:
    with mock_aws():
        boto3.client("s3", region_name=REGION).create_bucket(Bucket=BUCKET)
        ami = boto3.client("ec2", region_name=REGION).describe_images(Owners=["amazon"])["Images"][
            0
        ]["ImageId"]
        client = AwsProvider.from_config(
            {"region": REGION, "bucket": BUCKET, "ami_id": ami, "ssh_cidr": "127.0.0.1/32"}
        )
        spec = build_task_spec(
            app="bench", name="discovery", provider="aws", num_instances=n, priority="high"
        )
        task_id = f"bench-discovery-{n}"
        secret = signing.new_secret()
        signed = signing.SignedStore(client.store, signing.secret_from_hex(secret))
        blob = b"payload"
        digest = "0" * 64
        client.store.put(wire.payload_key(digest), blob)
        signed.put_record(
            wire.task_key(task_id),
            TaskRecord(task_id, spec.model_dump(mode="json"), digest, time.time(), 29400, 29500),
        )
        boot = BootConfig(task_id, "aws", client.config(), secret=secret)
        start = time.perf_counter()
        launched = client.launch(LaunchRequest(task_id, spec, boot))
        launch_seconds = time.perf_counter() - start
        start = time.perf_counter()  # what launch_task does once the gang is up
        signed.put_record(
            wire.membership_key(task_id, 0),
            MembershipRecord(
                0, [GangMember(i.instance_id, i.address) for i in launched], time.time()
            ),
        )
        record_seconds = time.perf_counter() - start
        ids = [i.instance_id for i in launched]
        recorded = client.clients.get("ec2", REGION).describe_instance_attribute(
            InstanceId=ids[0], Attribute="userData")  # what the user-data carries
        node_boot = boot_of(base64.b64decode(
            recorded["UserData"]["Value"]).decode())
        count = n if sample <= 0 else min(sample, n)
        picks = sorted({round(k * (n - 1) / max(count - 1, 1)) for k in range(count)})
        runs: dict[str, list[NodeRun]] = {path: [] for path in PATHS}
        for rank in picks:  # interleaved, so both paths see the same machine load
            for path in PATHS:
                runs[path].append(run_node(node_boot, task_id, ids[rank], n, path))
        naive_calls, naive_seconds = run_naive(ids)
        client.terminate(task_id)
    return SizeResult(n, runs, naive_calls, naive_seconds, launch_seconds, record_seconds)


def run_node(node_boot: BootConfig, task_id: str, instance_id: str, n: int,
             path: str) -> NodeRun:
    """What an agent does from boot to its rank, with the calls it makes counted."""
    with counting_session() as (session, calls, http):
        start = time.perf_counter()
        node = AwsProvider.from_config(node_boot.provider_config, session=session)
        store = signing.SignedStore(node.store, signing.secret_from_hex(node_boot.secret))
        record = TaskRecord.from_json(store.get_record(wire.task_key(task_id)) or b"")
        assert node.store.get(wire.payload_key(record.payload_digest)) is not None
        before = sum(calls.values())
        membership = learn_gang(node, store, task_id, instance_id, n, path)
        gang_calls = sum(calls.values()) - before
        store.put_record(
            wire.node_key(task_id, membership.node_rank),
            NodeRecord(membership.node_rank, instance_id, "", NodePhase.RENDEZVOUS, time.time()),
        )
        seconds = time.perf_counter() - start
    return NodeRun(membership.node_rank, calls, gang_calls, http[0], seconds,
                   membership.instance_ids, membership.leader_address)


def learn_gang(node: AwsProvider, store: signing.SignedStore, task_id: str, instance_id: str,
               n: int, path: str) -> Membership:
    if path == "describe":
        return discover(lambda: node.list_instances(task_id), instance_id, expected=n,
                        minimum=n, timeout_s=120)

    def read() -> list[GangMember] | None:
        raw = store.get_record(wire.membership_key(task_id, 0))
        return None if raw is None else MembershipRecord.from_json(raw).members

    pushed = from_record(read, instance_id, GRACE_S)
    if pushed is None:
        raise SystemExit(f"{instance_id}: the membership record is missing or stale")
    return pushed


def run_naive(ids: list[str]) -> tuple[int, float]:
    """A discovery that polls every peer by id: one call per peer."""
    ec2 = boto3.client("ec2", region_name=REGION)
    start = time.perf_counter()
    for instance_id in ids:
        ec2.describe_instances(InstanceIds=[instance_id])
    return len(ids), time.perf_counter() - start


def check(result: SizeResult) -> None:
    runs = [run for path in PATHS for run in result.runs[path]]
    ids_sorted = runs[0].ids
    for run in runs:
        assert run.ids == ids_sorted, "sampled nodes disagree on the membership"
        assert ids_sorted[run.rank] in run.ids
    assert len({run.leader for run in runs}) == 1
    for d, r in zip(result.runs["describe"], result.runs["record"]):
        assert d.rank == r.rank, "the record and the describe path gave different ranks"


def spread(values: list[int]) -> str:
    """``4`` when every node made the same number, else ``min-max``."""
    low, high = min(values), max(values)
    return f"{low}" if low == high else f"{low}-{high}"


def median_s(runs: list[NodeRun]) -> float:
    return statistics.median(run.seconds for run in runs)


def both(result: SizeResult, measure: Any) -> str:
    """``describe / record`` of one per-node measure."""
    return " / ".join(spread([measure(run) for run in result.runs[p]]) for p in PATHS)


def table(results: list[SizeResult]) -> str:
    head = (
        "| nodes | nodes run | DescribeInstances / node (describe / record) | API calls / "
        "node to learn the gang | API calls / node boot-to-rank | HTTP requests / node | "
        "median boot-to-rank s: describe | median boot-to-rank s: record | describe / record | "
        "launcher: "
        "write the record s | naive per-peer calls / node | real-EC2 describe pages |"
    )
    rows = [head, "|" + "---|" * 12]
    for r in results:
        describe, record = median_s(r.runs["describe"]), median_s(r.runs["record"])
        rows.append(
            f"| {r.nodes:,} | {len(r.runs['record'])} "
            f"| {both(r, lambda run: run.calls['ec2.DescribeInstances'])} "
            f"| {both(r, lambda run: run.gang_calls)} "
            f"| {both(r, lambda run: sum(run.calls.values()))} "
            f"| {both(r, lambda run: run.http)} | {describe:.3f} | {record:.3f} "
            f"| {describe / record:.1f}x | {r.record_seconds:.3f} | {r.naive_calls:,} "
            f"| {-(-r.nodes // PAGE)} |"
        )
    return "\n".join(rows)


def verdict(results: list[SizeResult]) -> list[str]:
    """One line per target, with whether this run met it."""
    pushed = [run for r in results for run in r.runs["record"]]
    describes = max(run.calls["ec2.DescribeInstances"] for run in pushed)
    gang = max(run.gang_calls for run in pushed)
    last = results[-1]
    speedup = median_s(last.runs["describe"]) / median_s(last.runs["record"])
    return [
        f"{'met' if describes == 0 else 'MISSED'}: DescribeInstances per node with the record: "
        f"{describes} (target 0)",
        f"{'met' if gang <= TARGET_GANG_CALLS else 'MISSED'}: API calls per node to learn the "
        f"gang with the record: {gang} (target <= {TARGET_GANG_CALLS})",
        f"{'met' if speedup >= TARGET_SPEEDUP else 'MISSED'}: median boot-to-rank at "
        f"{last.nodes:,} nodes, describe / record: {speedup:.1f}x (target >= "
        f"{TARGET_SPEEDUP:.0f}x)",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,256,1024")
    parser.add_argument(
        "--sample", type=int, default=4, help="nodes run per size, spread over the ranks (0: all)"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the markdown here")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results = []
    with tempfile.TemporaryDirectory(prefix="flow-bench-") as home:
        os.environ["FLOW_HOME"] = home  # per-task key files land here, not in ~/.flow
        for n in sizes:
            result = run_size(n, args.sample)
            check(result)
            results.append(result)
            print(
                f"  {n:>5} nodes: launch {result.launch_seconds:.1f}s, "
                f"{len(result.runs['record'])} node(s) run both ways",
                file=sys.stderr,
                flush=True,
            )
    text = table(results)
    lines = verdict(results)
    print(text)
    print("\n" + "\n".join(lines))
    if args.out is not None:
        args.out.write_text(report(text, lines, results, args), encoding="utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0 if all(line.startswith("met") for line in lines) else 1


def report(text: str, lines: list[str], results: list[SizeResult],
           args: argparse.Namespace) -> str:
    calls = {p: sorted({name for r in results for run in r.runs[p] for name in run.calls})
             for p in PATHS}
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    command = f"python bench/discovery.py --sizes {args.sizes} --sample {args.sample}"
    if args.out is not None:
        command += f" --out {args.out}"
    met = "\n".join(f"- {line}" for line in lines)
    return f"""## AWS provider: discovery + rank assignment at scale (pushed membership vs describe)

Command: `{command}` (in-process moto, no network; {os.cpu_count()} CPU cores, load average
{load} when the run ended: a shared machine, so read the seconds as rough, the ratios as the
result).

Each sampled node runs an agent's path from boot to its rank both ways, interleaved, with the
provider rebuilt from the config its user-data carries; every AWS API call it makes is counted
with botocore's `before-call` event. Calls per node on the describe path:
{", ".join(calls["describe"])}; on the record path: {", ".join(calls["record"])}.

{text}

{met}

- **record**: the launcher, which holds every instance id and private address from
  `run_instances`, writes the gang's signed membership record once (one PutObject; the
  "launcher" column); each node reads it with one GetObject, checks its MAC, and ranks by sorted
  instance id: no EC2 call at all. **describe** (the fallback when the record is absent or
  stale): one paged `DescribeInstances` by the task tag per poll.
- "to learn the gang" counts the calls between reading the payload and having a rank; "boot to
  rank" adds reading the task record and the payload and writing the node record (the same
  three calls on both paths).
- moto paginates `describe_instances` by reservation, so it answers a gang in one page; real
  EC2 pages by instance at `MaxResults=1000` (last column), and rate-limits describe calls
  per account: 1,024 nodes booting together send 1,024 of them on the describe path, none on
  the record path.
- Here every instance is `running` at once, so `discover` succeeds on its first poll; on EC2 a
  describe-path node polls every 0.25 s until the whole gang runs. The boot-to-rank time of the
  describe path grows with N because each response lists all N instances; in moto its XML
  serialization dominates. The record is JSON of about 60 bytes per node.
"""


if __name__ == "__main__":
    sys.exit(main())
