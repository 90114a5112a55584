#!/usr/bin/env bash
# Mutation testing of the core modules (see tools/mutation.py for how it works and keeps the working tree intact).
#   tools/mutation.sh ranking validation        40 sampled mutants per module (seed 0)
#   tools/mutation.sh core --all                every mutant of every core module
#   tools/mutation.sh --help                    all options
# Runs niced (MUTATION_NICE, default 10) with one pytest process at a time.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${REXMLE_PYTHON:-$root/.venv/bin/python}"
exec nice -n "${MUTATION_NICE:-10}" "$python" "$root/tools/mutation.py" "$@"
