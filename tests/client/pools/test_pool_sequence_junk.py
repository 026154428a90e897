"""Junk under a pool's sequence prefix stops no launch: keys no client writes, a forged claim
(junk bytes, another secret's seal, unsealed JSON) at any number. ``flow run --pool`` claims
the number after the pool's own claims, and the pool runs the tasks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flow_sdk.client.pools import Pool
from flow_sdk.wire import signing
from flow_sdk.wire.pools import SequenceClaim, sequence_key, sequence_prefix

pytestmark = pytest.mark.slow

FLOW = str(Path(sys.executable).with_name("flow"))


def _flow(*argv: str) -> str:
    done = subprocess.run([FLOW, *argv], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_junk_under_the_sequence_prefix_stops_no_launch(tmp_path: Path) -> None:
    _flow("pool", "up", "junk", "-N", "1", "--idle-stop", "10m")
    pool = Pool.named("junk")
    try:
        prefix, raw = sequence_prefix(pool.pool_id), pool.provider.store
        for name in ("x", "\u00b2", "\u0663", "-0000001", "0000001a", "sub/00000003",
                     "9" * 40, "00000004.json"):
            raw.put(prefix + name, b"junk")  # keys no client writes
        raw.put(sequence_key(pool.pool_id, 7), b"\x00\xff junk bytes")
        other = signing.SignedStore(raw, signing.secret_from_hex(signing.new_secret()))
        other.put_record(sequence_key(pool.pool_id, 9), SequenceClaim("pool.forged-9"))
        raw.put(sequence_key(pool.pool_id, 50), json.dumps({"task_id": "unsealed"}).encode())

        script = tmp_path / "hello.py"
        script.write_text("print('hello from the pool', flush=True)\n")
        for _ in range(2):
            assert " SUCCEEDED " in _flow("run", "--pool", "junk", str(script))
        # the pool's own claims: 0, then 1, whatever junk lies beside them
        claims = []
        for number in range(2):
            sealed = pool.store.get_record(sequence_key(pool.pool_id, number))
            assert sealed is not None, f"no claim {number}"
            claims.append(SequenceClaim.from_json(sealed).task_id)
        assert all(c.startswith(pool.pool_id + ".") for c in claims) and len(set(claims)) == 2
        assert pool.store.raw.get(sequence_key(pool.pool_id, 2)) is None
    finally:
        _flow("pool", "down", "junk")
