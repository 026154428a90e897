"""``flow run`` of a gang where one rank raises and its peers then die of gloo's connection
error: the output starts with the real error, at the user's own file, without SDK frames; the
peers' failures follow it, one line each."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

_BESIDE = Path(sys.executable).with_name("flow")
FLOW = str(_BESIDE) if _BESIDE.exists() else (shutil.which("flow") or "flow")
RANK_2_RAISES = """
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.ones(1)
dist.all_reduce(value)
if dist.get_rank() == 2:
    raise ValueError("rank 2 broke first")
dist.all_reduce(value)  # the others: the peer is gone, gloo raises a connection error
"""
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line \d+')


def test_flow_run_prints_the_real_error_first_and_its_consequences_after(tmp_path: Path
                                                                          ) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(RANK_2_RAISES))
    ran = subprocess.run([FLOW, "run", "-N", "2", "--workers-per-node", "2", str(script)],
                         capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert ran.returncode == 1, ran.stderr
    assert "Traceback" not in ran.stdout, ran.stdout
    err = ran.stderr
    assert err.count("Traceback (most recent call last):") == 1, err
    traceback = err[err.index("Traceback"):err.index("ValueError: rank 2 broke first")]
    files = [m["file"] for line in traceback.splitlines() if (m := _FRAME.match(line))]
    assert files == [str(script)], traceback
    assert "flow_sdk/" not in err
    after = err[err.index("ValueError: rank 2 broke first"):]
    # the peers that died of it, one line each: all three, or those whose failure came
    # within the consequence window on a loaded machine; never rank 2 itself
    counted = re.search(r"then, as consequences \((\d+)\):", after)
    assert counted is not None and 1 <= int(counted[1]) <= 3, after
    peers = after[counted.end():]
    assert peers.count("  node ") == int(counted[1]) and " rank 2:" not in peers, after
