#!/usr/bin/env bash
# Install flow-sdk and what it needs, from this checkout.
#   bash scripts/setup.sh          # the SDK with everything the README uses (the `all` extra:
#                                  # torch (CPU build when none is installed), boto3, pyarrow,
#                                  # xgboost, paramiko, the simulated cloud's moto and AWS CLI)
#   bash scripts/setup.sh --dev    # plus the test tools (the `dev` extra) and the system
#                                  # packages the tests need (OpenSSH server; Chromium for
#                                  # the dashboard's browser tests)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

# A plain `torch` requirement with no torch installed pulls several GB of CUDA wheels.
# Pin the CPU build first when torch is missing; pyproject keeps a range.
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  "$PY" -m pip install --quiet "torch==2.13.0"
fi

# The SDK, then the newest release of each direct dependency, as a fresh install gets them,
# even where an older one is installed already (pip keeps any release that satisfies a range
# otherwise); torch stays at the build installed above.
install() {
  local requirements
  "$PY" -m pip install --quiet -e ".[$1]"
  mapfile -t requirements < <("$PY" scripts/direct_requirements.py "$1")
  "$PY" -m pip install --quiet --upgrade "${requirements[@]}"
}

if [ "${1:-}" = "--dev" ]; then
  if ! command -v sshd >/dev/null 2>&1 && [ ! -x /usr/sbin/sshd ]; then
    SUDO=""; [ "$(id -u)" = "0" ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openssh-server openssh-client >/dev/null
  fi
  # The dashboard's browser tests drive Debian's Chromium through Playwright (which cannot
  # download a browser of its own here).
  if [ ! -x /usr/bin/chromium ]; then
    SUDO=""; [ "$(id -u)" = "0" ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
  fi
  install dev
else
  install all
fi
