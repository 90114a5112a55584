#!/usr/bin/env bash
# The GPU smoke check of the expert baselines, in one prepared script for a bare GPU machine.
#
# A GPU machine may have no package index, an older torch, and none of SimpleITK, MONAI, nnunetv2 or diffusers.
# So the wheels are gathered beforehand, on a machine with the index, and the GPU machine installs from them only:
#
#   tools/gpu_smoke.sh --download-wheels wheels/          # with network: every wheel the smoke needs (pinned by
#                                                         # constraints.txt) plus rexmle's own packages; run it
#                                                         # with the GPU machine's Python version and platform
#   tools/gpu_smoke.sh --wheels wheels/ --out smoke/      # on the GPU machine: a fresh venv from those wheels only,
#                                                         # then every family's `smoke` config with a time limit each
#
# Options: --python PY (default python3), --venv DIR (default .venv-gpu-smoke; --no-venv installs into the current
# Python), --limit SECONDS (per run, default 300), --only nnunet,monai-seg (some baselines), --constraints FILE
# (default constraints.txt; the CUDA build of torch is whichever torch wheel is in --wheels).
# Writes <out>/smoke_results.{json,md}: per run valid yes/no, seconds, peak GPU memory, seconds per step and the
# budget/full training times extrapolated from them (labelled as estimates). Exit code 0 only if every run wrote
# a valid submission.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON=python3
VENV="$ROOT/.venv-gpu-smoke"
USE_VENV=1
WHEELS=""
DOWNLOAD=""
OUT="$ROOT/gpu-smoke"
LIMIT=300
ONLY=""
CONSTRAINTS="$ROOT/constraints.txt"
PACKAGES=(torch torchvision numpy SimpleITK nibabel monai nnunetv2 timm diffusers)

while [[ $# -gt 0 ]]; do
  case "$1" in
    --wheels) WHEELS="$2"; shift 2 ;;
    --download-wheels) DOWNLOAD="$2"; shift 2 ;;
    --python) PYTHON="$2"; shift 2 ;;
    --venv) VENV="$2"; shift 2 ;;
    --no-venv) USE_VENV=0; shift ;;
    --out) OUT="$2"; shift 2 ;;
    --limit) LIMIT="$2"; shift 2 ;;
    --only) ONLY="$2"; shift 2 ;;
    --constraints) CONSTRAINTS="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "gpu_smoke.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

say() { printf '[gpu_smoke] %s\n' "$*" >&2; }

if [[ -n "$DOWNLOAD" ]]; then
  mkdir -p "$DOWNLOAD"
  say "building rexmle's own wheels into $DOWNLOAD"
  for package in rexmle-grade rexmle-tasks rexmle-baselines; do
    "$PYTHON" -m pip wheel --no-deps --wheel-dir "$DOWNLOAD" "$ROOT/packages/$package"
  done
  say "downloading every wheel they and the smoke need (constraints: $CONSTRAINTS)"
  "$PYTHON" -m pip download --dest "$DOWNLOAD" --find-links "$DOWNLOAD" -c "$CONSTRAINTS" \
    "rexmle-baselines[all]" "${PACKAGES[@]}"
  say "done: copy $DOWNLOAD to the GPU machine and run tools/gpu_smoke.sh --wheels $DOWNLOAD there"
  exit 0
fi

[[ -n "$WHEELS" ]] || { echo "gpu_smoke.sh: give --wheels DIR (made by --download-wheels) or see --help" >&2; exit 2; }
[[ -d "$WHEELS" ]] || { echo "gpu_smoke.sh: no wheel folder $WHEELS" >&2; exit 2; }
command -v nvidia-smi >/dev/null || { echo "gpu_smoke.sh: nvidia-smi not found: this is not a GPU machine" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >&2

if [[ "$USE_VENV" == 1 ]]; then
  say "creating $VENV"
  "$PYTHON" -m venv "$VENV"
  PY="$VENV/bin/python"
else
  PY="$PYTHON"
fi
export PIP_CONSTRAINT="$CONSTRAINTS"
PIP=("$PY" -m pip install --no-index --find-links "$WHEELS")
say "installing from $WHEELS only (no index)"
"${PIP[@]}" --upgrade pip || true  # an older pip is fine when no newer wheel was provided
"${PIP[@]}" "${PACKAGES[@]}"
"${PIP[@]}" rexmle-grade rexmle-tasks "rexmle-baselines[all]"

"$PY" - <<'EOF'
import sys
import torch
if not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} sees no CUDA GPU: is the torch wheel a CUDA build matching the driver?")
print(f"[gpu_smoke] torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}",
      file=sys.stderr)
EOF

mkdir -p "$OUT"
export REXMLE_DATA_DIR="$OUT/data" HF_HUB_OFFLINE=1
ARGS=(baselines smoke --out "$OUT" --limit "$LIMIT" --device cuda)
[[ -n "$ONLY" ]] && ARGS+=(--only "$ONLY")
say "running the smoke configs (limit ${LIMIT}s each); results in $OUT"
set +e
"$PY" -c 'import sys; from rexmle_grade.cli import main; sys.exit(main(sys.argv[1:]))' "${ARGS[@]}"
STATUS=$?
set -e
say "exit status $STATUS; table: $OUT/smoke_results.md"
exit "$STATUS"
