#!/usr/bin/env bash
# One-step, pinned install of the rexmle workspace into .venv (or $REXMLE_VENV).
#   bash tools/setup.sh           the four packages (no torch: baselines' heavy extras are opt-in)
#   bash tools/setup.sh --dev     + test and lint tools
#   bash tools/setup.sh --torch   + baselines' torch/MONAI/nnU-Net/timm/diffusers extras (several GB)
# Every pip call goes through constraints.txt (PIP_CONSTRAINT), so nothing can silently swap torch.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${REXMLE_VENV:-$root/.venv}"
dev=0; torch=0
for arg in "$@"; do
  case "$arg" in
    --dev) dev=1 ;;
    --torch) torch=1 ;;
    *) echo "setup.sh: unknown option '$arg' (expected --dev and/or --torch)" >&2; exit 2 ;;
  esac
done
# The default sandbox of agent runs is bubblewrap (Debian's package); install it where we may.
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing bubblewrap (the sandbox of agent runs)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; } >/dev/null \
      || echo "warning: could not install bubblewrap; agent runs need it (or --sandbox apptainer|docker)" >&2
  else
    echo "warning: bubblewrap is missing: run 'sudo apt-get install -y bubblewrap' before running agents" >&2
  fi
fi
# Agent code never runs as root: a harness running as root drops each run's code to an unprivileged uid/gid of its
# own (setpriv, from util-linux), leased from a range no account uses (checked at the end). The fixed user
# rexmle-sandbox is only for operators who set REXMLE_SANDBOX_USER=rexmle-sandbox (every run then shares it).
if [ "$(id -u)" = 0 ] && ! id rexmle-sandbox >/dev/null 2>&1; then
  useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin rexmle-sandbox 2>/dev/null \
    || echo "warning: could not create the user rexmle-sandbox (needed only with REXMLE_SANDBOX_USER)" >&2
fi
command -v setpriv >/dev/null 2>&1 || echo "warning: setpriv is missing (apt-get install -y util-linux); a harness" \
  "running as root needs it to run agent code unprivileged" >&2
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
export PIP_CONSTRAINT="$root/constraints.txt"
export PIP_DISABLE_PIP_VERSION_CHECK=1
pip=("$venv/bin/python" -m pip install --quiet)
baselines="$root/packages/rexmle-baselines"
[ "$torch" = 1 ] && baselines="$baselines[all]"
"${pip[@]}" -e "$root/packages/rexmle-grade" -e "$root/packages/rexmle-tasks" \
  -e "$root/packages/rexmle-agents" -e "$baselines"
if [ "$dev" = 1 ]; then
  "${pip[@]}" -e "$root[dev]"
  "${pip[@]}" -e "$root/packages/rexmle-agents[inspect]"  # Inspect (inspect_ai): tests/integrations run in CI
  # The `rexmle view` tests drive Debian's chromium through playwright (never a browser playwright downloads).
  if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "installing chromium (the browser of the rexmle view tests)"
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null \
        || echo "warning: could not install chromium; the browser tests of rexmle view will be skipped" >&2
    else
      echo "warning: chromium is missing: run 'sudo apt-get install -y chromium', or the browser tests of" \
           "rexmle view are skipped" >&2
    fi
  fi
  # The terminal agents' tests: OpenHands' terminal tool runs in tmux; the CLI agents install through npm.
  for program in tmux npm; do
    if ! command -v "$program" >/dev/null 2>&1; then
      if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing $program (the terminal agents' tests)"
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$program"; } >/dev/null \
          || echo "warning: could not install $program; tests of the agents that need it are skipped" >&2
      else
        echo "warning: $program is missing: run 'sudo apt-get install -y $program'" >&2
      fi
    fi
  done
  # The docker sandbox's tests (packages/rexmle-agents/tests/sandbox_docker) start their own private dockerd and
  # import a small image built on the spot: they need the engine's programs, never a running system Docker.
  if ! command -v dockerd >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "installing docker.io (the docker sandbox's tests start a private engine)"
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io; } >/dev/null \
        || echo "warning: could not install docker.io; the docker sandbox's tests will be skipped" >&2
    else
      echo "warning: dockerd is missing: run 'sudo apt-get install -y docker.io', or the docker sandbox's" \
           "tests are skipped" >&2
    fi
  fi
  # The SLURM tests start a one-node cluster (tools/slurm_local.py): Debian's SLURM daemons and clients, and munge.
  # In CI (a throwaway machine) also slurmdbd and MariaDB, for the accounting test; on a workstation they would
  # start a database service, so there that test is skipped unless they are installed by hand.
  slurm_packages="slurmctld slurmd slurm-client munge"
  [ -n "${CI:-}" ] && slurm_packages="$slurm_packages slurmdbd mariadb-server"
  missing=0
  for program in slurmctld slurmd sbatch munged $([ -n "${CI:-}" ] && echo slurmdbd mariadbd); do
    command -v "$program" >/dev/null 2>&1 || [ -x "/usr/sbin/$program" ] || missing=1
  done
  if [ "$missing" = 1 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "installing SLURM and munge (the one-node cluster of the SLURM tests)"
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $slurm_packages; } >/dev/null \
        || echo "warning: could not install $slurm_packages; the SLURM tests will be skipped" >&2
    else
      echo "warning: SLURM is missing: run 'sudo apt-get install -y $slurm_packages', or the SLURM tests are" \
           "skipped" >&2
    fi
  fi
fi
echo "rexmle installed in $venv ($("$venv/bin/rexmle" version | tr '\n' ' '))"
# The ids runs lease as root: print the range and check that no user, group or subordinate-id range uses it.
"$venv/bin/python" - <<'PY' || echo "warning: choose a free range with REXMLE_SANDBOX_UIDS=START:COUNT" >&2
from rexmle_agents.sandbox import identity
first, count = identity.id_range()
conflicts = identity.range_conflicts(first, count)
named = [f"{uid}: {what}" for uid in (first, first + count - 1) if (what := identity.named_elsewhere(uid))]
print(f"sandbox ids: {first}:{count} (uids and gids {first}..{first + count - 1}, one per run; "
      f"${identity.IDS_VARIABLE}=START:COUNT to change)")
for line in conflicts + named:
    print(f"  already in use: {line}")
raise SystemExit(1 if conflicts or named else 0)
PY
