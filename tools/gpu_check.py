#!/usr/bin/env python
"""On a GPU machine: does a sandboxed run see only its own GPUs? (well under 5 minutes)

For a bubblewrap sandbox given no GPU, each single GPU, and (with several) two runs side by side, it prints what
the code inside sees: the NVIDIA device nodes, `nvidia-smi -L`, and the CUDA driver's device count (libcuda through
ctypes, with CUDA_VISIBLE_DEVICES unset, so only the bound nodes limit it); a run given a GPU then trains a tiny
model on it when torch is installed. Exit status 0 when every check holds.

    python tools/gpu_check.py
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from rexmle_agents.sandbox import SandboxLimits, SandboxSpec, get_sandbox
from rexmle_agents.sandbox.identity import driver_gpus

INSIDE = r'''
import ctypes, json, os, subprocess
os.environ.pop("CUDA_VISIBLE_DEVICES", None)  # what the agent's code may do: only the bound nodes must limit it
seen = {"nodes": sorted(n for n in os.listdir("/dev") if n.startswith("nvidia")), "uid": os.getuid()}
try:
    seen["smi"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout.split("\n")
except OSError as exc:
    seen["smi"] = [f"nvidia-smi: {exc}"]
seen["smi"] = [line for line in seen["smi"] if line.strip()]
try:
    cuda = ctypes.CDLL("libcuda.so.1")
    count = ctypes.c_int(0)
    status = cuda.cuInit(0)
    seen["cuInit"] = status
    seen["cuda_devices"] = count.value if status else (cuda.cuDeviceGetCount(ctypes.byref(count)), count.value)[1]
except OSError as exc:
    seen["cuda_devices"], seen["cuda_error"] = 0, str(exc)
if os.environ.get("TRAIN") == "1":
    try:
        import torch
        model = torch.nn.Linear(64, 1).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(256, 64, device="cuda"), torch.randn(256, 1, device="cuda")
        first = None
        for _ in range(50):
            loss = torch.nn.functional.mse_loss(model(x), y)
            first = first if first is not None else float(loss)
            opt.zero_grad(); loss.backward(); opt.step()
        seen["trained"] = {"device": torch.cuda.get_device_name(0), "loss": [round(first, 4), round(float(loss), 4)]}
    except ImportError:
        seen["trained"] = "torch is not installed: skipped"
    except Exception as exc:
        seen["trained"] = f"FAILED: {type(exc).__name__}: {exc}"
print(json.dumps(seen))
'''


def inside(workspace: Path, public: Path, gpus: tuple[str, ...], *, train: bool) -> dict:
    spec = SandboxSpec(workspace=workspace, data=public, limits=SandboxLimits(gpus=gpus),
                       env={"TRAIN": "1" if train else "0"})
    result = get_sandbox("bwrap", spec).run([sys.executable, "-c", INSIDE], timeout_s=180)
    if not result.ok:
        return {"error": result.stderr_tail[-2000:]}
    return json.loads(result.stdout_path.read_text())


def main() -> int:
    if shutil.which("nvidia-smi") is None:
        print("no nvidia-smi here: this check needs a GPU machine (the fake-device tests cover the rest)")
        return 2
    host = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout.strip()
    devices = driver_gpus()
    print(f"host: {len(devices)} GPU(s)\n{host}\n")
    failures = []
    with tempfile.TemporaryDirectory(prefix="rexmle-gpu-check-") as tmp:
        root = Path(tmp)
        root.chmod(0o755)
        public = root / "public"
        public.mkdir()

        def workspace(name: str) -> Path:
            folder = root / name
            (folder / "submission").mkdir(parents=True)
            return folder

        none = inside(workspace("none"), public, (), train=False)
        print(f"run given no GPU: {json.dumps(none)}")
        if none.get("nodes") or none.get("cuda_devices"):
            failures.append("a run given no GPU sees a GPU")
        for device in devices:
            seen = inside(workspace(f"gpu{device.minor}"), public, (device.uuid,), train=True)
            print(f"run given {device.uuid}: {json.dumps(seen)}")
            if seen.get("cuda_devices") != 1 or not any(device.uuid in line for line in seen.get("smi", [])):
                failures.append(f"a run given {device.uuid} does not see exactly it")
            if isinstance(seen.get("trained"), str) and seen["trained"].startswith("FAILED"):
                failures.append(f"a run given {device.uuid} could not train: {seen['trained']}")
        if len(devices) >= 2:
            results: dict[str, dict] = {}

            def run(device) -> None:
                results[device.uuid] = inside(workspace(f"pair{device.minor}"), public, (device.uuid,), train=True)

            threads = [threading.Thread(target=run, args=(d,)) for d in devices[:2]]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            for uuid, seen in results.items():
                others = [d.uuid for d in devices if d.uuid != uuid]
                leaked = [o for o in others if any(o in line for line in seen.get("smi", []))]
                print(f"side by side, run given {uuid}: sees {seen.get('smi')}")
                if leaked or seen.get("cuda_devices") != 1:
                    failures.append(f"the run given {uuid} sees another run's GPU: {leaked}")
    print("\n" + ("every check holds" if not failures else "FAILED:\n  " + "\n  ".join(failures)))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
