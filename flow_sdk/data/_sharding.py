"""Balanced splitting of row groups (or rows) between ranks, from row counts only.

The balance rule: the row counts of any two shards differ by at most the size of the largest
row group. :func:`contiguous_ranges` keeps the row groups in order and gives every rank one
contiguous run of them; :func:`greedy_assignment` is the fallback with a one-line proof.
"""

from __future__ import annotations

import bisect
import heapq
import os
from collections.abc import Sequence

from flow_sdk.data._errors import ShardingError

RANK_ENV = "RANK"
WORLD_SIZE_ENV = "WORLD_SIZE"


def check_rank(rank: int, world_size: int) -> None:
    """Raise :class:`ShardingError` unless ``0 <= rank < world_size``."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ShardingError(f"world_size must be a positive integer, got {world_size!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ShardingError(
            f"rank must be an integer in [0, {world_size - 1}] for world_size={world_size}, "
            f"got {rank!r}"
        )


def rank_from_env() -> tuple[int, int]:
    """Read this process's ``(rank, world_size)`` from the ``RANK`` / ``WORLD_SIZE`` env vars."""
    raw_rank = os.environ.get(RANK_ENV)
    raw_world = os.environ.get(WORLD_SIZE_ENV)
    if raw_rank is None or raw_world is None:
        missing = [n for n, v in ((RANK_ENV, raw_rank), (WORLD_SIZE_ENV, raw_world)) if v is None]
        raise ShardingError(
            f"get_shard() without arguments reads the {RANK_ENV} and {WORLD_SIZE_ENV} "
            f"environment variables, but {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set; call it inside a running task "
            "or pass get_shard(rank, world_size) explicitly"
        )
    try:
        rank, world_size = int(raw_rank), int(raw_world)
    except ValueError:
        raise ShardingError(
            f"{RANK_ENV}={raw_rank!r} and {WORLD_SIZE_ENV}={raw_world!r} must be integers"
        ) from None
    check_rank(rank, world_size)
    return rank, world_size


def even_row_ranges(num_rows: int, world_size: int) -> list[tuple[int, int]]:
    """Split ``num_rows`` rows into ``world_size`` contiguous ``(start, stop)`` ranges.

    Sizes differ by at most one row.
    """
    return [
        (rank * num_rows // world_size, (rank + 1) * num_rows // world_size)
        for rank in range(world_size)
    ]


def _prefix_sums(counts: Sequence[int]) -> list[int]:
    prefix = [0]
    for count in counts:
        prefix.append(prefix[-1] + count)
    return prefix


def _reachable(prefix: list[int], world_size: int, low: int, high: int) -> list[tuple[int, int]]:
    """Cut positions reachable after each number of parts, every part's rows in [low, high].

    With ``high - low`` at least the largest row group, the cut positions reachable after k
    parts always form one interval ``[a_k, b_k]`` of indices: the windows
    ``[prefix[i] + low, prefix[i] + high]`` of consecutive ``i`` overlap because consecutive
    prefix sums differ by at most ``high - low``. So each step is two binary searches.
    Returns the intervals for k = 0..world_size, or stops early (shorter list) when empty.
    """
    n = len(prefix) - 1
    intervals = [(0, 0)]
    a, b = 0, 0
    for _ in range(world_size):
        new_a = max(a, bisect.bisect_left(prefix, prefix[a] + low))
        new_b = bisect.bisect_right(prefix, prefix[b] + high) - 1
        if new_a > n or new_a > new_b:
            return intervals
        a, b = new_a, new_b
        intervals.append((a, b))
    return intervals


def _smallest_low(prefix: list[int], world_size: int, biggest: int) -> int | None:
    """The smallest ``low`` whose reachable set after the last rank contains every row group,
    or ``None`` if there is none.

    The smallest shard never holds more than the average, so low <= total // world_size.
    Larger low only moves both interval ends right: too small a low ends short of n, too
    large a low runs out of row groups before the last rank; so a binary search finds it.
    """
    n = len(prefix) - 1
    first = None
    left, right = 0, prefix[-1] // world_size
    while left <= right:
        mid = (left + right) // 2
        intervals = _reachable(prefix, world_size, mid, mid + biggest)
        if len(intervals) != world_size + 1:
            right = mid - 1
        elif intervals[-1][1] >= n:
            first = mid
            right = mid - 1
        else:
            left = mid + 1
    return first


def contiguous_ranges(counts: Sequence[int], world_size: int) -> list[tuple[int, int]] | None:
    """Give each rank a contiguous ``(start, stop)`` range of row-group indices.

    Finds cut points such that every shard holds between ``low`` and ``low + M`` rows, where
    ``M`` is the largest row group, so any two shards differ by at most ``M`` rows. The set
    of feasible ``low`` values is an interval (both interval ends above move monotonically
    with ``low``), so the smallest feasible ``low`` is found by binary search; cut points are
    then chosen, from the last rank back, as close to the even split as the window allows.
    Returns ``None`` if no such split exists (the caller then uses
    :func:`greedy_assignment`).
    """
    check_rank(0, world_size)
    n = len(counts)
    if any(c < 0 for c in counts):
        raise ValueError("row counts must be non-negative")
    prefix = _prefix_sums(counts)
    total = prefix[-1]
    if n == 0 or total == 0:
        return [(0, n) if rank == 0 else (n, n) for rank in range(world_size)]
    biggest = max(counts)
    first = _smallest_low(prefix, world_size, biggest)
    if first is None:
        return None
    low, high = first, first + biggest
    intervals = _reachable(prefix, world_size, low, high)
    if len(intervals) != world_size + 1 or not intervals[-1][0] <= n <= intervals[-1][1]:
        return None
    cuts = [n]
    for k in range(world_size - 1, 0, -1):
        a, b = intervals[k]
        nxt = prefix[cuts[-1]]
        start = max(a, bisect.bisect_left(prefix, nxt - high))
        stop = min(b, cuts[-1], bisect.bisect_right(prefix, nxt - low) - 1)
        if start > stop:
            return None
        target = total * k / world_size
        near = min(max(bisect.bisect_left(prefix, target), start), stop)
        candidates = (i for i in (near - 1, near) if start <= i <= stop)
        best = min(candidates, key=lambda i: (abs(prefix[i] - target), i))
        cuts.append(best)
    cuts.append(0)
    cuts.reverse()
    ranges = [(cuts[r], cuts[r + 1]) for r in range(world_size)]
    sizes = [prefix[stop] - prefix[start] for start, stop in ranges]
    if any(start > stop for start, stop in ranges) or max(sizes) - min(sizes) > biggest:
        return None
    return ranges


def greedy_assignment(counts: Sequence[int], world_size: int) -> list[list[int]]:
    """Assign row groups, largest first, each to the rank holding the fewest rows so far.

    Balance proof: let shard S end with the most rows and g be the last group it received.
    When g was assigned S held the fewest rows, so every other shard then held at least
    ``rows(S) - g``, and shards only grow; hence ``max - min <= g <= M``. Row groups keep
    their file order within each shard.
    """
    check_rank(0, world_size)
    heap = [(0, rank) for rank in range(world_size)]
    shards: list[list[int]] = [[] for _ in range(world_size)]
    for index in sorted(range(len(counts)), key=lambda i: (-counts[i], i)):
        rows, rank = heapq.heappop(heap)
        shards[rank].append(index)
        heapq.heappush(heap, (rows + counts[index], rank))
    return [sorted(s) for s in shards]


def assign_row_groups(counts: Sequence[int], world_size: int) -> list[list[int]]:
    """Row-group indices per rank: contiguous balanced ranges, else the greedy assignment."""
    ranges = contiguous_ranges(counts, world_size)
    if ranges is not None:
        return [list(range(start, stop)) for start, stop in ranges]
    return greedy_assignment(counts, world_size)
