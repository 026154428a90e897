#!/usr/bin/env bash
# Install flow-sdk and what it needs, from this checkout, into the Python that `python3` (or
# $PYTHON) runs: a virtual environment's, preferably (it says so when it is not one).
#   bash scripts/setup.sh            # the SDK with everything the README uses (the `all` extra:
#                                    # torch (CPU build when none is installed), boto3, pyarrow,
#                                    # xgboost, paramiko, the simulated cloud's moto and AWS CLI)
#   bash scripts/setup.sh --dev      # plus the test tools (the `dev` extra) and the system
#                                    # packages the tests need (OpenSSH server; Chromium for
#                                    # the dashboard's browser tests; Slurm and munge for the
#                                    # Slurm tests' cluster; one apt-get update),
#                                    # then byte-compiles the tests once
#   bash scripts/setup.sh --dry-run  # (with or without --dev) print the steps, run none
# Each step prints one line ("[2/3] ..."), then the installer's own progress; the last line
# says how long it all took.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
TORCH_PIN="torch==2.13.0"

DEV=0
DRY=0
for arg in "$@"; do
  case "$arg" in
    --dev) DEV=1 ;;
    --dry-run) DRY=1 ;;
    *) echo "setup.sh: unknown option $arg; use --dev, --dry-run or neither" >&2; exit 2 ;;
  esac
done

if ! PY_PATH="$(command -v "$PY")"; then
  echo "setup.sh: no $PY on PATH; install Python 3.11 or later, or set PYTHON" >&2
  exit 1
fi

if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  found="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  echo "setup.sh: $PY_PATH is Python $found; the set-up needs Python 3.11 or later (set" \
    "PYTHON to one)" >&2
  exit 1
fi

# uv takes a bare name (python3) as a version request and then refuses an interpreter of no
# virtual environment, such as a CI machine's; the interpreter's own path it takes as given.
PY_EXE="$("$PY" -c 'import sys; print(sys.executable)')"

# pip installs into (and upgrades) whatever environment $PY belongs to. CI machines are
# throwaway: no warning there.
if [ "${CI:-}" != "true" ] && \
   [ "$("$PY" -c 'import sys; print(sys.prefix != sys.base_prefix)')" != "True" ]; then
  cat >&2 <<EOF
setup.sh: warning: $PY_PATH is not in a virtual environment; this installs the SDK into it and
  upgrades each of its direct dependencies there. To keep them apart, press Ctrl-C, run
    python3 -m venv .venv && . .venv/bin/activate
  then this command again.
EOF
fi

EXTRA=all
[ "$DEV" = 1 ] && EXTRA=dev
TOTAL=3
[ "$DEV" = 1 ] && TOTAL=5
STEP=0
# One line per step: "[2/3] what it does ...".
step() {
  STEP=$((STEP + 1))
  echo "[$STEP/$TOTAL] $*"
}
# Run a command; with --dry-run, only show it.
run() {
  if [ "$DRY" = 1 ]; then
    echo "      would run: $*"
  else
    "$@"
  fi
}

SUDO=""
[ "$(id -u)" = "0" ] || SUDO="sudo"
APT_PID=""  # the background apt-get, while it runs
UV_HOME=""  # uv's temporary folder
# On the way out, a failure's included: the background apt-get is waited for (stopping it
# half-way could leave dpkg to repair), and uv's folder removed.
finish() {
  if [ -n "$APT_PID" ]; then
    echo "setup.sh: waiting for apt-get to finish ..." >&2
    wait "$APT_PID" || true  # its error, if any, is above; this run has failed already
  fi
  [ -z "$UV_HOME" ] || rm -rf "$UV_HOME"
}
trap finish EXIT
apt_install() {
  run $SUDO apt-get update -qq
  if [ "$DRY" = 1 ]; then
    echo "      would run: $SUDO apt-get install -y -qq $*"
  else
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
  fi
}

# The system packages the tests need, those missing installed with one `apt-get update`:
# the OpenSSH server (`flow ssh` to local nodes), Debian's Chromium (the dashboard's browser
# tests drive it through Playwright, which cannot download a browser of its own here), and
# Slurm with munge (the Slurm tests start a real cluster on this machine: munged, slurmctld
# and several slurmd).
if [ "$DEV" = 1 ]; then
  missing=()
  { command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ]; } || \
    missing+=(openssh-server openssh-client)
  [ -x /usr/bin/chromium ] || missing+=(chromium)
  for program in slurmctld slurmd sbatch munged; do
    if ! command -v "$program" >/dev/null 2>&1; then
      missing+=(slurmctld slurmd slurm-client munge)
      break
    fi
  done
  if [ "${#missing[@]}" = 0 ]; then
    step "system packages (OpenSSH server, Chromium, Slurm and munge): installed already"
  else
    step "system packages: OpenSSH server, Chromium, Slurm and munge (apt-get install" \
      "${missing[*]}), in the background while the Python packages install ..."
    if [ "$DRY" = 1 ]; then
      apt_install "${missing[@]}"
    else
      # sudo asks for its password here, in the foreground, not from the background job
      [ -z "$SUDO" ] || $SUDO true
      apt_install "${missing[@]}" &
      APT_PID=$!
    fi
  fi
fi

# A plain `torch` requirement with no torch installed pulls several GB of CUDA wheels.
# Pin the CPU build first when torch is missing; pyproject keeps a range.
if "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"
then
  step "torch: installed already, kept as it is"
else
  step "torch CPU build ($TORCH_PIN, about 200 MB), byte-compiled on every core ..."
  run "$PY" -m pip install --no-compile "$TORCH_PIN"
  # pip would compile its 2,300 modules one by one; one file is Python 3.12 syntax on purpose
  site="$("$PY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
  run "$PY" -m compileall -q -j 0 -x '/py312_intrinsics[.]py$' "$site/torch"
fi

# The SDK and the newest release of each of its direct dependencies (pyproject's list for the
# extra, torch left out), in one run: as a fresh install gets them, even where an older one is
# installed already (an installer keeps any release that satisfies a range otherwise); torch
# stays at the build installed above. uv does it: it downloads, unpacks and byte-compiles in
# parallel what it installs, where pip takes minutes.
# pip fetches uv into a temporary folder, not into the environment; where uv cannot be fetched
# or fails (an index only pip is configured for, say), pip installs the same packages.
listed="$("$PY" scripts/direct_requirements.py "$EXTRA")"
mapfile -t requirements <<< "$listed"
upgrades=()
for requirement in "${requirements[@]}"; do
  upgrades+=(--upgrade-package "${requirement%%[\[<>=\!~\;]*}")
done
packages=(-e ".[$EXTRA]" "${requirements[@]}")
step "flow-sdk from this checkout, with the '$EXTRA' extra and the newest release of each" \
  "direct dependency, torch kept (uv pip install -e '.[$EXTRA]' ...) ..."
uv_install=(pip install --python "$PY_EXE" --compile-bytecode "${upgrades[@]}" "${packages[@]}")
if [ "$DRY" = 1 ]; then
  echo "      would run: $PY -m pip install --quiet --target <temporary folder> uv"
  echo "      would run: uv ${uv_install[*]}"
else
  UV_HOME="$(mktemp -d)"
  if ! { "$PY" -m pip install --quiet --target "$UV_HOME" uv && \
         "$UV_HOME/bin/uv" "${uv_install[@]}"; }; then
    echo "setup.sh: uv could not install them (its error is above); pip does instead" >&2
    "$PY" -m pip install --upgrade "${packages[@]}"
  fi
fi
# An editable install leaves the SDK's modules uncompiled, and an interpreter started with
# PYTHONDONTWRITEBYTECODE (or without write access here) would compile them again in every
# node agent, worker and `flow` command it starts: compile them once, now.
step "byte-compiling the SDK's modules (python -m compileall flow_sdk) ..."
run "$PY" -m compileall -q flow_sdk
# The same for the tests: pytest rewrites the asserts of every test module and plugin it
# imports, again in each of its runners, unless it finds them rewritten already. Collecting
# the suite once, with bytecode written, leaves them rewritten; the bench and example modules
# that test processes import are compiled beside them.
if [ "$DEV" = 1 ]; then
  step "byte-compiling the tests (pytest --collect-only; python -m compileall tests bench" \
    "examples) ..."
  collect=(env -u PYTHONDONTWRITEBYTECODE "$PY" -m pytest --collect-only -qq -o addopts=
           -p no:cacheprovider)
  if [ "$DRY" = 1 ]; then
    echo "      would run: ${collect[*]}"
  else
    "${collect[@]}" | tail -n 1
  fi
  run "$PY" -m compileall -q tests bench examples
fi

if [ -n "$APT_PID" ]; then
  waited=0
  wait "$APT_PID" || waited=$?
  APT_PID=""
  if [ "$waited" != 0 ]; then
    echo "setup.sh: apt-get install of the system packages failed (its error is above)" >&2
    exit 1
  fi
  echo "      system packages: installed"
fi

if [ "$DRY" = 1 ]; then
  echo "set-up: dry run, nothing installed"
else
  echo "set-up: done in $((SECONDS / 60))m $((SECONDS % 60))s"
fi
