"""An agent's guesses of which of its test inputs are held-out selection cases, from everything it can see: the
public folder (names, manifests, sample submission, sizes, times, inode numbers, directory order) and the installed
rexmle_tasks (the split rule and seed). Run as a script (``python selection_guesses.py PUBLIC TASK K``, also inside
a sandbox) it prints ``{heuristic: [K names]}`` as JSON; the tests compare each guess with the true selection."""

from __future__ import annotations

import csv
import json
import os
import re
import sys
from pathlib import Path


def guesses(public: Path, task_id: str, k: int) -> dict[str, list[str]]:
    from rexmle_tasks.registry import get_task
    from rexmle_tasks.splits import make_split

    split = json.loads((public / "split_manifest.json").read_text())
    train, test = split["train_ids"], split["test_ids"]
    manifest = json.loads((public / "test_manifest.json").read_text())["ids"]
    meta = get_task(task_id).meta
    # the package's own split rule over every id the agent sees: what it calls "train" must be carved cases
    rule = make_split(sorted({*train, *test}), seed=meta.split.seed, test_fraction=meta.split.test_fraction)
    by_rule = [i for i in test if i not in rule.test] + [i for i in test if i in rule.test]
    # ids numbered among the training ids (an official test set numbered after the training set gives this away)
    last_train = max(train)
    among_train = sorted(test, key=lambda i: (i > last_train, i))
    with (public / "sample_submission" / "submission.csv").open(newline="") as fh:
        sample_order = [row[0] for row in list(csv.reader(fh))[1:]]
    pattern = re.compile(r"(?<![A-Za-z0-9.])(" + "|".join(map(re.escape, sorted(test, key=len, reverse=True)))
                         + r")(?![A-Za-z0-9])")
    stats: dict[str, list[os.stat_result]] = {i: [] for i in test}
    listed: list[str] = []
    for folder, _, files in os.walk(public / "test"):
        for name in files:  # directory order, as the file system returns it
            hit = pattern.search(name)
            if hit:
                stats[hit.group(1)].append(os.stat(os.path.join(folder, name)))
                listed.append(hit.group(1))

    def top(key, reverse: bool = True) -> list[str]:
        return sorted(test, key=lambda i: (key(stats[i]), i), reverse=reverse)[:k]

    return {
        "split_rule": by_rule[:k],
        "numbered_among_training": among_train[:k],
        "manifest_first": manifest[:k],
        "manifest_last": manifest[-k:],
        "sample_submission_first": sample_order[:k],
        "directory_order_first": list(dict.fromkeys(listed))[:k],
        "directory_order_last": list(dict.fromkeys(reversed(listed)))[:k],
        "largest": top(lambda s: sum(x.st_size for x in s)),
        "smallest": top(lambda s: sum(x.st_size for x in s), reverse=False),
        "newest_mtime": top(lambda s: max(x.st_mtime_ns for x in s)),
        "newest_ctime": top(lambda s: max(x.st_ctime_ns for x in s)),
        "oldest_ctime": top(lambda s: min(x.st_ctime_ns for x in s), reverse=False),
        "highest_inode": top(lambda s: max(x.st_ino for x in s)),
        "lowest_inode": top(lambda s: min(x.st_ino for x in s), reverse=False),
    }


if __name__ == "__main__":
    print(json.dumps(guesses(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]))))
