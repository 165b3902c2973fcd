#!/usr/bin/env bash
# Make bench/.venv-baselines: pyinfra and ansible-core for the fleet bench's baselines.
#
# They live in their own venv so they never enter orch's dependencies (or its
# test environment). Pinned, so a rerun measures the same baselines.
#   bash bench/setup.sh            # idempotent: reuses the venv when the pins are there
#   BASELINES_VENV=/path bash bench/setup.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${BASELINES_VENV:-$here/.venv-baselines}"
python="${PYTHON:-python3}"
pins=(pyinfra==3.10.0 ansible-core==2.19.14)

if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/pip" install -q --disable-pip-version-check "${pins[@]}"
"$venv/bin/pyinfra" --version
version="$("$venv/bin/ansible-playbook" --version)"
echo "${version%%$'\n'*}"
echo "baselines venv ready: $venv"
