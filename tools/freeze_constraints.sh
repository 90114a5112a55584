#!/usr/bin/env bash
# Rewrite constraints.txt from the current .venv (keeps the torch/torchvision pins at the top).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${REXMLE_VENV:-$root/.venv}"
head -n 5 "$root/constraints.txt" > "$root/constraints.txt.new"
"$venv/bin/python" -m pip freeze --exclude-editable | grep -v -i -E '^(rexmle|torch==|torchvision==|-e )' >> "$root/constraints.txt.new"
mv "$root/constraints.txt.new" "$root/constraints.txt"
