"""Benchmark graders on synthetic test sets of realistic size: seconds per case, peak memory, parallel scaling.

For each grader it writes a prepared task (``public/test_manifest.json``, ``private/answers.csv`` + label files)
and an imperfect submission, then times the generic path everything else uses, ``grade_submission`` (reading both
volumes, validation, every metric, aggregation), each time in a fresh Python process so that the peak RSS (the
process's ``VmHWM`` and, with workers, ``getrusage`` of its largest child) and the CPU time belong to that run
alone; imports happen before the clock starts:

* one case with ``--workers 1`` (per-case cost and memory);
* ``--cases`` cases (default 25) with each of ``--workers`` (default 1 and 2), for throughput and scaling.

    python tools/bench_grade.py                              # TopCoW task 1 (CTA), 512x512x300
    python tools/bench_grade.py --grader all --json bench.json
    python tools/bench_grade.py --grader topcow-track1-task1 --profile   # cProfile of the one-case run

Adding a grader = one entry in :data:`SCENARIOS`: a function drawing one case (ground truth, prediction, spacing
and any extra private text files such as an ROI) for graders whose answers are a ``label_path`` volume and whose
submission is one label-volume column. Graders that are not installed are skipped with a note. Wall time on a
shared machine includes waiting for a core; the CPU column does not.
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import itertools
import json
import os
import pstats
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from rexmle_grade.errors import UnknownNameError
from rexmle_grade.grader import Grader, TestManifest, get_grader, write_submission_csv
from rexmle_grade.grading import grade_submission
from rexmle_grade.io import Geometry, write_volume

IDENTITY = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0)
Point = tuple[float, float, float]  # voxel coordinates (x, y, z)


# ---- drawing ----------------------------------------------------------------------------------------------------
def draw_tube(labels: np.ndarray, points: Sequence[Point], radius: float, value: int) -> None:
    """Paint a polyline tube of ``radius`` voxels into a (z, y, x) array, segment by segment inside its box."""
    limits = np.array(labels.shape[::-1]) - 1
    for p, q in itertools.pairwise(points):
        p, q = np.asarray(p, float), np.asarray(q, float)
        lo = np.clip(np.floor(np.minimum(p, q) - radius), 0, limits).astype(int)
        hi = np.clip(np.ceil(np.maximum(p, q) + radius), 0, limits).astype(int)
        x, y, z = np.ogrid[lo[0]:hi[0] + 1, lo[1]:hi[1] + 1, lo[2]:hi[2] + 1]
        d = q - p
        t = np.clip(((x - p[0]) * d[0] + (y - p[1]) * d[1] + (z - p[2]) * d[2]) / max(d @ d, 1e-9), 0.0, 1.0)
        inside = (x - p[0] - t * d[0]) ** 2 + (y - p[1] - t * d[1]) ** 2 + (z - p[2] - t * d[2]) ** 2 <= radius**2
        region = labels[lo[2]:hi[2] + 1, lo[1]:hi[1] + 1, lo[0]:hi[0] + 1]
        region[inside.transpose(2, 1, 0)] = value


def draw_ball(labels: np.ndarray, centre: Point, radii: Point, value: int) -> None:
    """Paint an axis-aligned ellipsoid (radii in voxels along x, y, z)."""
    c, r = np.asarray(centre, float), np.asarray(radii, float)
    limits = np.array(labels.shape[::-1]) - 1
    lo = np.clip(np.floor(c - r), 0, limits).astype(int)
    hi = np.clip(np.ceil(c + r), 0, limits).astype(int)
    x, y, z = np.ogrid[lo[0]:hi[0] + 1, lo[1]:hi[1] + 1, lo[2]:hi[2] + 1]
    inside = ((x - c[0]) / r[0]) ** 2 + ((y - c[1]) / r[1]) ** 2 + ((z - c[2]) / r[2]) ** 2 <= 1.0
    labels[lo[2]:hi[2] + 1, lo[1]:hi[1] + 1, lo[0]:hi[0] + 1][inside.transpose(2, 1, 0)] = value


# ---- one generated case -----------------------------------------------------------------------------------------
@dataclass
class SyntheticCase:
    gt: np.ndarray  # (z, y, x) label map, written as the private label_path
    pred: np.ndarray  # (z, y, x) prediction, written at the submission's path
    spacing_xyz: tuple[float, float, float]
    texts: dict[str, str] = field(default_factory=dict)  # extra answer column -> private text file content


CaseMaker = Callable[[np.random.Generator, tuple[int, int, int]], SyntheticCase]


# Circle of Willis in a 512x512x300 CTA grid (x, y, z voxels; LPS+: left = larger x, posterior = larger y).
# label: (radius in voxels, polyline). Right-side vessels are mirrored about x = 256 for the left ones.
_RIGHT_COW = {
    2: (2.5, [(256, 290, 150), (226, 295, 152), (180, 320, 160)]),  # R-PCA
    4: (4.5, [(215, 240, 40), (215, 245, 110), (220, 250, 148)]),  # R-ICA
    5: (3.0, [(220, 250, 148), (170, 245, 155), (140, 250, 165)]),  # R-MCA
    8: (1.2, [(220, 252, 148), (224, 275, 150), (226, 295, 152)]),  # R-Pcom
    11: (2.5, [(220, 250, 148), (245, 215, 155), (250, 180, 175)]),  # R-ACA
}
_LEFT_OF = {2: 3, 4: 6, 5: 7, 8: 9, 11: 12}
_MIDLINE_COW = {
    1: (3.5, [(256, 300, 40), (256, 295, 110), (256, 290, 150)]),  # BA
    10: (1.5, [(246, 214, 156), (266, 214, 156)]),  # Acom
    15: (1.5, [(256, 214, 157), (256, 195, 175)]),  # 3rd-A2
}


def cow_vessels(centre_x: float = 256.0) -> dict[int, tuple[float, list[Point]]]:
    vessels = dict(_MIDLINE_COW)
    for label, (radius, points) in _RIGHT_COW.items():
        vessels[label] = (radius, points)
        vessels[_LEFT_OF[label]] = (radius, [(2 * centre_x - x, y, z) for x, y, z in points])
    return vessels


def _paint(shape: tuple[int, int, int], vessels: dict[int, tuple[float, list[Point]]], rng: np.random.Generator,
           jitter: float, radius_scale: tuple[float, float]) -> np.ndarray:
    labels = np.zeros(shape, np.uint8)
    for label, (radius, points) in vessels.items():
        moved = [tuple(np.asarray(p) + rng.normal(0.0, jitter, 3)) for p in points]
        draw_tube(labels, moved, radius * rng.uniform(*radius_scale), label)
    return labels


def _roi_text(gt: np.ndarray, z_from: int, margin: int) -> str:
    zs, ys, xs = np.nonzero(gt[z_from:])
    lo = np.maximum([xs.min() - margin, ys.min() - margin, zs.min() + z_from - margin], 0)
    hi = np.minimum([xs.max() + margin, ys.max() + margin, zs.max() + z_from + margin], np.array(gt.shape[::-1]) - 1)
    size = hi - lo + 1
    return f"--- ROI Meta Data ---\nSize (Voxels): {size[0]} {size[1]} {size[2]}\nLocation (Voxels): " \
           f"{lo[0]} {lo[1]} {lo[2]}\n"


def _imperfect(gt_vessels: dict[int, tuple[float, list[Point]]], optional: Sequence[int], rng: np.random.Generator,
               shape: tuple[int, int, int], fp_labels: Sequence[int], fp_box: tuple[Point, Point]) -> np.ndarray:
    """A plausible model output: jittered centrelines, radii off by up to 15 %, a missed small vessel, FP blobs."""
    vessels = {k: v for k, v in gt_vessels.items() if not (k in optional and rng.random() < 0.3)}
    pred = _paint(shape, vessels, rng, jitter=1.0, radius_scale=(0.85, 1.15))
    low, high = np.asarray(fp_box[0]), np.asarray(fp_box[1])
    for _ in range(3):
        draw_ball(pred, tuple(rng.uniform(low, high)), (2.0, 2.0, 2.0), int(rng.choice(fp_labels)))
    return pred


def topcow_case(rng: np.random.Generator, shape: tuple[int, int, int]) -> SyntheticCase:
    """TopCoW task 1: 13 CoW vessel classes (3rd-A2 in half the cases), GT ROI around the circle."""
    centre = shape[2] / 2
    vessels = cow_vessels(centre)
    if rng.random() < 0.5:
        del vessels[15]
    gt = _paint(shape, vessels, rng, jitter=0.0, radius_scale=(1.0, 1.0))
    pred = _imperfect(vessels, (8, 9, 10, 15), rng, shape, (8, 9, 10, 15),
                      ((centre - 60, 200, 130), (centre + 60, 300, 170)))
    return SyntheticCase(gt=gt, pred=pred, spacing_xyz=(0.45, 0.45, 0.6), texts={"roi_path": _roi_text(gt, 120, 8)})


def topbrain_case(rng: np.random.Generator, shape: tuple[int, int, int]) -> SyntheticCase:
    """TopBrain CTA: the CoW classes plus 27 more random vessels (labels 13..40) across the whole volume."""
    vessels = cow_vessels(shape[2] / 2)
    for label in range(13, 41):
        if label != 15:
            start = rng.uniform((40, 40, 20), (shape[2] - 40, shape[1] - 40, shape[0] - 20))
            points = [tuple(start + rng.normal(0, 25, 3) * k) for k in range(4)]
            vessels[label] = (float(rng.uniform(1.2, 3.0)), points)
    gt = _paint(shape, vessels, rng, jitter=0.0, radius_scale=(1.0, 1.0))
    side_roads = (8, 9, 10, 15, 16, *range(25, 35), 37, 38, 39)
    pred = _imperfect(vessels, side_roads, rng, shape, side_roads, ((60, 60, 40), (450, 450, 260)))
    return SyntheticCase(gt=gt, pred=pred, spacing_xyz=(0.45, 0.45, 0.6))


def aorta_case(rng: np.random.Generator, shape: tuple[int, int, int]) -> SyntheticCase:
    """SEG.A.: a binary aorta (arch, descending aorta, iliac bifurcation) in a torso CTA grid."""
    x, y = shape[2] / 2, shape[1] / 2
    z_top, z_split = shape[0] - 20, shape[0] // 4
    trunk = [(x - 40, y - 60, z_top - 30), (x, y - 80, z_top), (x + 30, y - 20, z_top - 25), (x + 20, y, z_split)]
    branches = [[(x + 20, y, z_split), (x + sign * 60, y + 10, 10)] for sign in (-1, 1)]

    def aorta(jitter: float, scale: tuple[float, float]) -> np.ndarray:
        mask = np.zeros(shape, np.uint8)
        for radius, points in [(14.0, trunk), *((7.0, b) for b in branches)]:
            draw_tube(mask, [tuple(np.asarray(p) + rng.normal(0, jitter, 3)) for p in points],
                      radius * rng.uniform(*scale), 1)
        return mask

    return SyntheticCase(gt=aorta(0.0, (1.0, 1.0)), pred=aorta(1.5, (0.9, 1.1)), spacing_xyz=(0.8, 0.8, 1.5))


def tumour_case(rng: np.random.Generator, shape: tuple[int, int, int]) -> SyntheticCase:
    """PANTHER: pancreas (2) holding a tumour (1); the prediction is a binary tumour mask, shifted and resized."""
    centre = np.array([shape[2] * 0.5, shape[1] * 0.55, shape[0] * 0.5])
    gt = np.zeros(shape, np.uint8)
    draw_ball(gt, tuple(centre), (70.0, 25.0, 12.0), 2)
    tumour_radii = tuple(rng.uniform(8, 20, 3))
    draw_ball(gt, tuple(centre + rng.normal(0, 10, 3)), tumour_radii, 1)
    pred = np.zeros(shape, np.uint8)
    draw_ball(pred, tuple(centre + rng.normal(0, 4, 3)), tuple(np.asarray(tumour_radii) * 1.1), 1)
    return SyntheticCase(gt=gt, pred=pred, spacing_xyz=(0.75, 0.75, 2.5))


def lesion_case(rng: np.random.Generator, shape: tuple[int, int, int]) -> SyntheticCase:
    """ISLES'22: a few ischaemic lesions on a DWI grid; the prediction misses one and adds one."""
    gt, pred = np.zeros(shape, np.uint8), np.zeros(shape, np.uint8)
    high = np.array(shape[::-1]) - 10
    centres = [rng.uniform(10, high) for _ in range(4)]
    for i, c in enumerate(centres):
        radii = tuple(rng.uniform(2, 8, 3))
        draw_ball(gt, tuple(c), radii, 1)
        if i:
            draw_ball(pred, tuple(c + rng.normal(0, 1, 3)), radii, 1)
    draw_ball(pred, tuple(rng.uniform(10, high)), (3.0, 3.0, 3.0), 1)
    return SyntheticCase(gt=gt, pred=pred, spacing_xyz=(2.0, 2.0, 2.0))


@dataclass(frozen=True)
class Scenario:
    make_case: CaseMaker
    shape: tuple[int, int, int]  # (z, y, x)
    id_format: str  # test ids, formatted with the case number
    label_suffix: str = ".nii.gz"


SCENARIOS: dict[str, Scenario] = {
    "topcow-track1-task1": Scenario(topcow_case, (300, 512, 512), "topcow_ct_{:03d}"),
    "topbrain-track1": Scenario(topbrain_case, (300, 512, 512), "topcow_ct_{:03d}"),
    "seg_a": Scenario(aorta_case, (400, 512, 512), "K{}", ".seg.nrrd"),
    "panther-task1": Scenario(tumour_case, (90, 512, 512), "{:05d}_0001", ".mha"),
    "isles22": Scenario(lesion_case, (73, 112, 112), "sub-strokecase{:04d}"),
}
DEFAULT_GRADERS = ("topcow-track1-task1",)


# ---- task writing -------------------------------------------------------------------------------------------------
def write_task(grader: Grader, scenario: Scenario, root: Path, n_cases: int, seed: int) -> dict[str, Path]:
    """Write ``root/{public,private,submission}`` with ``n_cases`` cases; returns the three folders."""
    public, private, submission = root / "public", root / "private", root / "submission"
    for folder in (public, private, submission):
        folder.mkdir(parents=True, exist_ok=True)
    (column,) = grader.schema.file_columns
    ids, geometries, answer_rows, rows = [], {}, [], []
    for number in range(1, n_cases + 1):
        case_id = scenario.id_format.format(number)
        case = scenario.make_case(np.random.default_rng(seed + number), scenario.shape)
        geometry = Geometry(size=tuple(reversed(case.gt.shape)), spacing=case.spacing_xyz, origin=(0.0, 0.0, 0.0),
                            direction=IDENTITY)
        answers = {grader.schema.id_column: case_id, "label_path": f"labels/{case_id}{scenario.label_suffix}"}
        write_volume(private / answers["label_path"], case.gt, geometry)
        for name, text in case.texts.items():
            answers[name] = f"{name.removesuffix('_path')}/{case_id}.txt"
            (private / answers[name]).parent.mkdir(parents=True, exist_ok=True)
            (private / answers[name]).write_text(text)
        row = grader.schema.example_row(case_id)
        write_volume(submission / row[column.name], case.pred, geometry)
        ids.append(case_id)
        geometries[case_id] = geometry
        answer_rows.append(answers)
        rows.append(row)
    TestManifest(ids=tuple(ids), geometry=geometries).write(public)
    with (private / "answers.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(answer_rows[0]))
        writer.writeheader()
        writer.writerows(answer_rows)
    write_submission_csv(submission, grader.schema, rows)
    return {"public": public, "private": private, "submission": submission}


def first_case_task(grader: Grader, task: dict[str, Path], root: Path) -> None:
    """A one-case view of ``task`` under ``root`` (private answers shared, prediction hard-linked where possible)."""
    manifest = TestManifest.read(task["public"])
    case_id = manifest.ids[0]
    public, submission = root / "public", root / "submission"
    public.mkdir(parents=True, exist_ok=True)
    (root / "private").symlink_to(task["private"].resolve(), target_is_directory=True)
    TestManifest(ids=(case_id,), geometry={case_id: manifest.geometry[case_id]}).write(public)
    row = grader.schema.example_row(case_id)
    (column,) = grader.schema.file_columns
    target = submission / row[column.name]
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(task["submission"] / row[column.name], target)
    except OSError:
        shutil.copyfile(task["submission"] / row[column.name], target)
    write_submission_csv(submission, grader.schema, [row])


# ---- measuring (in a fresh process) --------------------------------------------------------------------------------
def peak_rss_mb() -> float:
    """This process's peak RSS. Not ``ru_maxrss``: on Linux that survives ``exec`` and so would include the
    high-water mark of the benchmark process that spawned this one."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_child_rss_mb() -> float:
    """Peak RSS of the largest reaped child (the workers, forked from this process): ``ru_maxrss`` in kB."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def cpu_seconds() -> float:
    """User + system CPU time of this process and its reaped children (worker processes)."""
    return sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, (resource.RUSAGE_SELF,
                                                                         resource.RUSAGE_CHILDREN)))


def measure(grader_id: str, task_root: Path, workers: int, profile: bool) -> dict[str, object]:
    """Grade the task under ``task_root`` once; runs inside the child process."""
    import SimpleITK  # noqa: F401 - imported lazily by the readers; a one-off cost kept out of the timing

    grader = get_grader(grader_id)
    baseline = peak_rss_mb()
    profiler = cProfile.Profile() if profile else None
    cpu_started, started = cpu_seconds(), time.perf_counter()
    if profiler:
        profiler.enable()
    result = grade_submission(grader, task_root / "submission", task_root / "public", task_root / "private",
                              workers=workers)
    if profiler:
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(30)
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu_started
    return {"status": result.status, "seconds": seconds, "cpu_seconds": cpu, "cases": len(result.per_case),
            "peak_rss_mb": peak_rss_mb(), "baseline_rss_mb": baseline, "peak_child_rss_mb": peak_child_rss_mb(),
            "metrics": result.metrics, "problems": result.problems[:5], "error": result.error}


def run_child(grader_id: str, task_root: Path, workers: int, profile: bool = False) -> dict[str, object]:
    command = [sys.executable, __file__, "_measure", grader_id, str(task_root), "--workers", str(workers)]
    if profile:
        command.append("--profile")
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if profile:
        print(done.stderr, file=sys.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"measurement of {grader_id} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@dataclass
class Row:
    grader: str
    run: str
    cases: int
    workers: int
    seconds: float
    seconds_per_case: float
    cpu_seconds_per_case: float
    peak_rss_mb: float
    baseline_rss_mb: float
    status: str


def bench_grader(grader_id: str, scenario: Scenario, work: Path, n_cases: int, workers: Sequence[int], seed: int,
                 profile: bool) -> list[Row]:
    grader = get_grader(grader_id)
    started = time.perf_counter()
    task = write_task(grader, scenario, work / grader_id / "full", n_cases, seed)
    print(f"[{grader_id}] wrote {n_cases} synthetic cases of {scenario.shape[::-1]} (x, y, z) in "
          f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
    first_case_task(grader, task, work / grader_id / "single")
    runs = [("1 case", work / grader_id / "single", 1, profile)]
    runs += [(f"{n_cases} cases", work / grader_id / "full", w, False) for w in workers]
    rows = []
    for label, root, n_workers, with_profile in runs:
        out = run_child(grader_id, root, n_workers, with_profile)
        if out["status"] != "valid":
            raise RuntimeError(f"{grader_id} did not grade: {out['problems']} {out['error']}")
        peak = max(float(out["peak_rss_mb"]), float(out["peak_child_rss_mb"]))
        cases = int(out["cases"])
        rows.append(Row(grader_id, label, cases, n_workers, float(out["seconds"]), float(out["seconds"]) / cases,
                        float(out["cpu_seconds"]) / cases, peak, float(out["baseline_rss_mb"]), str(out["status"])))
    return rows


def print_table(rows: Sequence[Row]) -> None:
    header = f"{'grader':<22} {'run':<10} {'workers':>7} {'wall s':>8} {'wall s/case':>11} {'CPU s/case':>10} " \
             f"{'peak RSS MB':>11} {'(after imports)':>15}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r.grader:<22} {r.run:<10} {r.workers:>7} {r.seconds:>8.2f} {r.seconds_per_case:>11.2f} "
              f"{r.cpu_seconds_per_case:>10.2f} {r.peak_rss_mb:>11.0f} {r.baseline_rss_mb:>15.0f}")
    by_grader: dict[str, dict[int, float]] = {}
    for r in rows:
        if r.run != "1 case":
            by_grader.setdefault(r.grader, {})[r.workers] = r.seconds
    for grader_id, times in by_grader.items():
        if 1 in times and len(times) > 1:
            speedups = ", ".join(f"{w} workers x{times[1] / t:.2f}" for w, t in sorted(times.items()) if w != 1)
            print(f"{grader_id}: speed-up over 1 worker: {speedups}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grader", nargs="+", default=list(DEFAULT_GRADERS),
                        help=f"grader ids, or 'all' ({', '.join(SCENARIOS)})")
    parser.add_argument("--cases", type=int, default=25, help="cases in the throughput runs (default 25)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts to compare")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    parser.add_argument("--work-dir", type=Path, help="keep the synthetic tasks here (default: a temporary folder)")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of each one-case run to stderr")
    args = parser.parse_args(argv)
    names = list(SCENARIOS) if args.grader == ["all"] else args.grader
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"no synthetic cases for {unknown}; add an entry to SCENARIOS (known: {', '.join(SCENARIOS)})")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="rexmle-bench-"))
    rows: list[Row] = []
    try:
        for name in names:
            try:
                get_grader(name)
            except UnknownNameError:
                print(f"[{name}] skipped: grader not installed", file=sys.stderr)
                continue
            rows += bench_grader(name, SCENARIOS[name], work, args.cases, args.workers, args.seed, args.profile)
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_measure":
        child = argparse.ArgumentParser()
        child.add_argument("mode")
        child.add_argument("grader_id")
        child.add_argument("task_root", type=Path)
        child.add_argument("--workers", type=int, default=1)
        child.add_argument("--profile", action="store_true")
        ns = child.parse_args()
        print(json.dumps(measure(ns.grader_id, ns.task_root, ns.workers, ns.profile)))
        sys.exit(0)
    sys.exit(main())
