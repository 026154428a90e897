"""The procs node's bootstrap: standard library only, run by path (``python -I -S boot.py
LAUNCH_FILE``) before anything of flow_sdk or flow_procs is installed where the node runs.

It reads the node's launch file (JSON, 0600: the wheels by path and SHA-256, the caller's
Python, the folder to install them in, the module to run and its environment), checks this
interpreter's Python and every wheel's digest before installing anything, unpacks the wheels (pure Python) into the node's own folder, and replaces
itself with ``python -m MODULE`` run on that folder.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import zipfile
from pathlib import Path, PurePosixPath


def _checked(wheel: dict[str, str]) -> bytes:
    data = Path(wheel["path"]).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != wheel["sha256"]:
        raise SystemExit(f"procs boot: {wheel['filename']} has SHA-256 {digest}, but the "
                         f"launch shipped {wheel['sha256']}; nothing was installed")
    return data


def _unpack(data: bytes, site: Path, filename: str) -> None:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for name in archive.namelist():
            path = PurePosixPath(name)
            if path.is_absolute() or ".." in path.parts:
                raise SystemExit(f"procs boot: {filename} holds the path {name!r} outside "
                                 "its folder; nothing more was installed")
        archive.extractall(site)


def main(launch_file: str) -> None:
    launch = json.loads(Path(launch_file).read_text(encoding="utf-8"))
    mine = "%d.%d" % sys.version_info[:2]
    if mine != launch["python"]:
        raise SystemExit(f"procs boot: this node runs Python {mine}, but the caller runs "
                         f"Python {launch['python']}; nothing was installed")
    site = Path(launch["site"])
    wheels = [(wheel["filename"], _checked(wheel)) for wheel in launch["wheels"]]
    site.mkdir(mode=0o700)
    for filename, data in wheels:
        _unpack(data, site, filename)
    print(f"procs boot: installed {', '.join(name for name, _ in wheels)} into {site}",
          flush=True)
    env = {**os.environ, **launch["env"], "PYTHONPATH": str(site)}
    os.execve(sys.executable, [sys.executable, "-m", launch["module"]], env)


if __name__ == "__main__":
    main(sys.argv[1])
