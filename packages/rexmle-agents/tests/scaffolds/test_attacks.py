"""The scaffold engine's own writes and deletes against scripts that plant links: the "model" writes node scripts
that replace the next node's script file, or a parallel worker's folder, with links to host files and folders.
The engine must replace the links, never write or delete through them."""

from __future__ import annotations

from pathlib import Path

from rexmle_agents.harness.spec import Limits

PLANT_NEXT_SCRIPT = '''
import os
# the engine will write node 1's script here next: point it at a host file
if not os.path.islink("node_0001.py"):
    os.symlink({canary!r}, "node_0001.py")
'''

PLANT_WORKER_FOLDER = '''
import os, shutil
os.makedirs("workers", exist_ok=True)
target = "workers/1"
if not os.path.islink(target):
    shutil.rmtree(target, ignore_errors=True)
    os.symlink({victim!r}, target)  # the engine resets workers/1/submission before each node of worker 1
'''


def test_node_scripts_replace_a_planted_link_instead_of_writing_through_it(run_scaffold, fakes,
                                                                           tmp_path: Path) -> None:
    canary = tmp_path / "canary.txt"
    canary.write_text("host file")
    plant = PLANT_NEXT_SCRIPT.format(canary=str(canary)) + fakes.good(1.0)
    fake = fakes.FakeModel([plant, fakes.good(2.0)])
    outcome, _ = run_scaffold("aide", fake, config={"num_drafts": 2}, limits=Limits(time_limit_s=120, max_steps=2,
                                                                                     exec_timeout_s=30))
    assert outcome.state == "finished", outcome.reason
    assert canary.read_text() == "host file"
    written = outcome.run_dir / "workspace" / "working" / "node_0001.py"
    assert not written.is_symlink() and written.read_text().strip() == fakes.good(2.0).strip()


def test_cleaning_a_workers_folder_deletes_the_planted_link_not_the_host_folder(run_scaffold, fakes,
                                                                                tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    (victim / "submission").mkdir(parents=True)
    (victim / "submission" / "precious.txt").write_text("keep me")
    (victim / "keep.txt").write_text("keep me too")
    plant = PLANT_WORKER_FOLDER.format(victim=str(victim)) + fakes.good(1.0)

    class Planting(fakes.FakeModel):
        def __call__(self, messages, tools, config):
            reply = super().__call__(messages, tools, config)
            if isinstance(reply, str) and "```python" in reply:  # every script the model writes plants the link
                reply = reply.replace("```python\n", "```python\n" + PLANT_WORKER_FOLDER.format(victim=str(victim)), 1)
            return reply

    fake = Planting([plant, fakes.good(1.0)])
    outcome, _ = run_scaffold("mcts", fake, config={"workers": 2, "num_drafts": 2, "max_nodes": 6},
                              limits=Limits(time_limit_s=120, exec_timeout_s=30))
    assert outcome.state == "finished", outcome.reason
    assert (victim / "submission" / "precious.txt").read_text() == "keep me"
    assert (victim / "keep.txt").read_text() == "keep me too"
    worker_folder = outcome.run_dir / "workspace" / "working" / "workers" / "1"
    assert worker_folder.is_symlink() or worker_folder.is_dir()  # whatever the last script left; the host is intact
