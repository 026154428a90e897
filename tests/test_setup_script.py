"""`scripts/setup.sh` says what it does: one numbered line per step (a dry run prints the same
steps and the commands it would run, installing nothing), and a warning, never a refusal, when
the Python it installs into is not a virtual environment's (except on CI)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "setup.sh"
STEP = re.compile(r"^\[(\d)/(\d)\] ")
WARNING = "is not in a virtual environment"


def _setup(python: Path, *args: str, ci: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHON"] = str(python)
    if ci:
        env["CI"] = "true"
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60, env=env, stdin=subprocess.DEVNULL)


def _base_python() -> Path:
    """The interpreter of no virtual environment: this one's base."""
    found = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    assert found.is_file(), found
    return found


def _steps(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if STEP.match(line)]


def test_a_dry_run_prints_each_step_numbered_and_installs_nothing(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")],
                   check=True, timeout=60)
    python = tmp_path / "venv" / "bin" / "python"
    done = _setup(python, "--dry-run")
    assert done.returncode == 0, done.stderr
    assert WARNING not in done.stderr, done.stderr
    steps = _steps(done.stdout)
    assert [s[:5] for s in steps] == ["[1/3]", "[2/3]", "[3/3]"], done.stdout
    # no torch in the fresh environment: the CPU pin is the first step, pip the command, then
    # its modules byte-compiled on every core
    assert steps[0].startswith("[1/3] torch CPU build (torch=="), steps
    assert f"would run: {python} -m pip install --no-compile torch==" in done.stdout
    assert re.search(rf"would run: {re.escape(str(python))} -m compileall -q -j 0 .* "
                     r"\S+/site-packages/torch$", done.stdout, re.MULTILINE), done.stdout
    # the SDK and the newest release of each direct dependency but torch, in one uv run; pip
    # fetches uv outside the environment
    assert steps[1] == ("[2/3] flow-sdk from this checkout, with the 'all' extra and the newest "
                        "release of each direct dependency, torch kept (uv pip install "
                        "-e '.[all]' ...) ...")
    assert (f"would run: {python} -m pip install --quiet --target <temporary folder> uv"
            in done.stdout)
    uv_line = next(line for line in done.stdout.splitlines()
                   if line.startswith(f"      would run: uv pip install --python {python} "))
    words = uv_line.split()
    assert words[7] == "--compile-bytecode" and " -e .[all] " in uv_line, uv_line
    assert "boto3>=1.34" in words and "torch" not in uv_line, uv_line
    upgraded = {words[i + 1] for i, word in enumerate(words) if word == "--upgrade-package"}
    assert {"boto3", "moto", "pydantic", "xgboost"} <= upgraded, uv_line
    assert steps[2] == "[3/3] byte-compiling the SDK's modules (python -m compileall flow_sdk) ..."
    assert f"would run: {python} -m compileall -q flow_sdk" in done.stdout
    assert done.stdout.splitlines()[-1] == "set-up: dry run, nothing installed"
    # nothing was installed into it
    assert not list((tmp_path / "venv").glob("lib/python*/site-packages/*flow*"))


def test_outside_a_virtual_environment_it_warns_and_goes_on_but_not_on_ci() -> None:
    python = _base_python()
    done = _setup(python, "--dev", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert f"setup.sh: warning: {python} {WARNING}" in done.stderr, done.stderr
    assert "python3 -m venv .venv && . .venv/bin/activate" in done.stderr
    steps = _steps(done.stdout)
    assert [s[:5] for s in steps] == [f"[{i}/5]" for i in range(1, 6)], done.stdout
    assert steps[0].startswith("[1/5] system packages") and "OpenSSH server, Chromium, Slurm " \
        "and munge" in steps[0], steps
    assert "with the 'dev' extra" in steps[2]
    assert steps[4].startswith("[5/5] byte-compiling the tests"), steps
    assert "-m pytest --collect-only" in done.stdout

    on_ci = _setup(python, "--dev", "--dry-run", ci=True)
    assert on_ci.returncode == 0 and WARNING not in on_ci.stderr, on_ci.stderr
    assert _steps(on_ci.stdout) == steps


def test_uv_gets_the_interpreter_by_its_path_where_the_set_up_was_given_a_bare_name(
        tmp_path: Path) -> None:
    """CI runs the machine's ``python3``, no virtual environment: uv takes a bare name as a
    version request and refuses such an interpreter, so the set-up fell back to pip there."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", CI="true")
    done = subprocess.run(["bash", str(SCRIPT), "--dev", "--dry-run"], capture_output=True,
                          text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    uv_line = next(line for line in done.stdout.splitlines()
                   if line.startswith("      would run: uv pip install "))
    assert uv_line.split()[5:7] == ["--python", str(bin_dir / "python3")], uv_line


def test_a_python_older_than_3_11_is_refused_before_anything_is_installed(
        tmp_path: Path) -> None:
    old = tmp_path / "python3.10"  # answers the version check as a Python 3.10 would
    old.write_text('#!/bin/sh\ncase "$2" in *sys.exit*) exit 1 ;; *) echo 3.10 ;; esac\n')
    old.chmod(0o755)
    done = _setup(old, "--dry-run")
    assert done.returncode == 1 and not done.stdout, done.stdout
    assert done.stderr.strip() == (f"setup.sh: {old} is Python 3.10; the set-up needs Python "
                                   "3.11 or later (set PYTHON to one)")


def test_an_unknown_option_is_refused_naming_the_ones_it_takes() -> None:
    done = _setup(Path(sys.executable), "--nodes")
    assert done.returncode == 2 and not done.stdout
    assert done.stderr.strip() == ("setup.sh: unknown option --nodes; use --dev, --dry-run "
                                   "or neither")


# A stand-in interpreter: the real one for the set-up's own checks and scripts; pip fails to
# fetch uv (as where only pip's configured index is reachable); pip's own installs, the
# compiling and the test collection are logged and pass.
FAKE_PYTHON = """#!/bin/sh
echo "python $*" >> "$SETUP_LOG"
case "$*" in
  *"-m pip install --quiet --target"*) echo "no uv on this index" >&2; exit 1 ;;
  *"-m pip install"*|*"-m compileall"*|*"-m pytest"*) exit 0 ;;
esac
exec REAL "$@"
"""
FAKE_APT = """#!/bin/sh
echo "apt-get $1 start" >> "$SETUP_LOG"
sleep 2
echo "apt-get $1 end" >> "$SETUP_LOG"
[ "$1" = update ] || exit "${FAKE_APT_RC:-0}"
"""


def _setup_with_stand_ins(tmp_path: Path, apt_rc: int) -> tuple[subprocess.CompletedProcess[str],
                                                                 list[str]]:
    """``setup.sh --dev`` with the stand-ins first on a PATH where Slurm's daemons are missing
    (they live in /usr/sbin): its apt-get runs, in the background."""
    bin_dir, log = tmp_path / "bin", tmp_path / "setup.log"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(FAKE_PYTHON.replace("REAL", sys.executable))
    (bin_dir / "apt-get").write_text(FAKE_APT)
    for tool in ("python", "apt-get"):
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHON": str(bin_dir / "python"),
           "SETUP_LOG": str(log), "FAKE_APT_RC": str(apt_rc), "CI": "true"}
    done = subprocess.run(["bash", str(SCRIPT), "--dev"], capture_output=True, text=True,
                          timeout=120, env=env, stdin=subprocess.DEVNULL)
    return done, log.read_text().splitlines()


@pytest.mark.skipif(os.getuid() != 0, reason="without root the set-up asks sudo first")
def test_apt_get_runs_beside_the_python_steps_and_pip_installs_where_uv_cannot(
        tmp_path: Path) -> None:
    done, log = _setup_with_stand_ins(tmp_path, apt_rc=0)
    assert done.returncode == 0, done.stderr
    assert "in the background while the Python packages install" in _steps(done.stdout)[0]
    assert "setup.sh: uv could not install them (its error is above); pip does instead" \
        in done.stderr, done.stderr
    fallback = next(i for i, line in enumerate(log)
                    if "-m pip install --upgrade -e .[dev]" in line)
    assert log.index("apt-get update start") < fallback < log.index("apt-get install end"), log
    assert done.stdout.splitlines()[-2:-1] == ["      system packages: installed"], done.stdout

    failed, _ = _setup_with_stand_ins(tmp_path / "failing", apt_rc=100)
    assert failed.returncode == 1 and "set-up: done" not in failed.stdout
    assert "setup.sh: apt-get install of the system packages failed" in failed.stderr
