"""Trainer code's steps as stages of one fenced child (``fence.run_fenced_stages``): the launch's
trainer checks and its preflight import the trainer once, and each stage still answers for itself:
its value, its own error (named by what it was) raised only when asked, a fence trip charged to the
stage that tripped it, and no answer from a stage the child never reached."""

import os
import sys
from pathlib import Path

import pytest

from parcel_hpc.errors import UsageError
from parcel_hpc.fence import Protected, run_fenced_stages
from parcel_hpc.fence.child import _frames
from parcel_hpc.governance.outcome import GovernanceRefusal, Outcome
from parcel_hpc.testing import launch, parcel_hpc

ENDED = "the trainer's code ended the fenced process before it answered"


@pytest.fixture
def protected(artifacts) -> Protected:
    return Protected.of(artifacts["split_path"], artifacts["snapshot_path"])


def test_each_stage_answers_for_itself_and_a_later_error_waits_until_asked(protected):
    def stages():
        yield {"first": [1, 2]}
        raise UsageError("the second went wrong; fix it")

    first, second = run_fenced_stages(protected, ("stage one", "stage two"), stages)
    assert first.result() == {"first": [1, 2]}
    with pytest.raises(UsageError, match=r"^the second went wrong; fix it$"):
        second.result()


def test_a_stage_that_ends_the_process_leaves_the_answers_before_it_whole(protected):
    def stages():
        yield "kept"
        os._exit(7)

    first, second = run_fenced_stages(protected, ("stage one", "stage two"), stages)
    assert first.result() == "kept"
    with pytest.raises(UsageError, match=rf"^stage two: {ENDED} \(it exited with status 7\)"):
        second.result()


def test_a_failed_stage_is_the_last_one_run(protected):
    def stages():
        yield "one"
        raise RuntimeError("two broke")
        yield "three"  # never reached: a generator that raised is done

    one, two, three = run_fenced_stages(protected, ("one", "two", "three"), stages)
    assert one.result() == "one"
    with pytest.raises(UsageError, match=r"^two: RuntimeError: two broke$"):
        two.result()
    with pytest.raises(UsageError, match=rf"^three: {ENDED}"):  # not a StopIteration asked of the finished generator
        three.result()


def test_a_fence_trip_is_charged_to_the_stage_that_tripped_it_and_ends_the_child(protected, artifacts):
    final = Path(artifacts["final_path"])

    def stages():
        yield "clean"
        try:
            with open(final, "rb") as f:
                f.read(1)
        except PermissionError:
            pass
        yield "read the final list"
        yield "after the trip"

    clean, tripped, after = run_fenced_stages(protected, ("clean", "tripping", "after"), stages)
    assert clean.result() == "clean"
    with pytest.raises(GovernanceRefusal) as refused:
        tripped.result()
    assert refused.value.outcome is Outcome.REJECT_FINAL_PARTITION
    assert refused.value.detail.startswith(f"tripping: trainer code opened {final}")
    with pytest.raises(UsageError, match=rf"^after: {ENDED}"):
        after.result()


def test_lines_trainer_code_writes_to_the_pipe_are_passed_over_and_a_stage_answered_twice_has_no_answer():
    ours = b'\n{"stage": 0, "value": 1, "tripped": []}\n'
    assert _frames(b"progress 10% without a newline" + ours + b"[1, 2]\nnot json\n") == {0: {"stage": 0, "value": 1, "tripped": []}}
    forged = b'{"stage": 1, "value": "forged", "tripped": []}\n'
    assert _frames(forged + ours + b'\n{"stage": 1, "value": "real", "tripped": []}\n') == {0: {"stage": 0, "value": 1, "tripped": []}, 1: None}
    tripped = b'\n{"stage": 1, "failed": "x", "tripped": ["opened /data/final.json"]}\n'
    assert _frames(forged + tripped)[1] == {"stage": 1, "tripped": ["opened /data/final.json"]}  # a forged line hides no trip
    assert _frames(b"[" * 100_000 + b"\n" + ours) == {0: {"stage": 0, "value": 1, "tripped": []}}  # past the parser's depth: passed over


COUNTED = r"""
import os
from parcel_hpc.trainer.numpy_mlp import NumpyMLP

open(os.path.join(os.environ["IMPORTS_DIR"], str(os.getpid())), "x").close()  # one file for each process that imports this


class Counted(NumpyMLP):
    def build(self, params, seed, data):
        if os.environ.get("FAIL_BUILD"):
            raise RuntimeError("built to fail")
        super().build(params, seed, data)
        with open(os.path.join(os.environ["IMPORTS_DIR"], "built"), "a") as f:
            f.write(f"{os.getpid()}\n")  # the preflight builds it: in which process
"""


@pytest.fixture
def counted(tmp_path):
    """Where each process that imports ``counted_trainer:Counted`` (and each build) leaves its pid; the launch's env."""
    mods, imports = tmp_path / "mods", tmp_path / "imports"
    mods.mkdir()
    imports.mkdir()
    (mods / "counted_trainer.py").write_text(COUNTED)
    env = {"PYTHONPATH": os.pathsep.join([str(mods), *sys.path]), "IMPORTS_DIR": str(imports)}
    return imports, env


def _launch(tmp_path, data_dir, env, revision, *extra):
    args = [f"search.root={tmp_path / 'runs'}", f"search.revision={revision}", "trainer.target=counted_trainer:Counted", *extra]
    return launch(args, cwd=tmp_path, data_dir=data_dir, env=env)


def _imported(imports: Path) -> set[str]:
    return {p.name for p in imports.iterdir() if p.name != "built"}


def test_a_fresh_launch_imports_the_trainer_once_for_its_checks_and_its_preflight(tmp_path, data_dir, counted):
    imports, env = counted
    res = _launch(tmp_path, data_dir, env, "counted-r1", "search.n_trials=2", "search.dry_run=true")
    assert res.returncode == 0, res.stdout + res.stderr
    assert len(_imported(imports)) == 1  # the trainer checks and the preflight: one child, one import
    assert set((imports / "built").read_text().split()) == _imported(imports)  # and the preflight ran in it


def test_a_failing_preflight_still_speaks_after_the_launch_s_other_refusals_and_never_on_a_relaunch(tmp_path, data_dir, counted):
    imports, env = counted
    shared = f"checkpoint.dir={tmp_path / 'ckpt'}"
    assert _launch(tmp_path, data_dir, env, "first-r1", "search.n_trials=0", shared).returncode == 0  # frozen; its checkpoints marked
    failing = {**env, "FAIL_BUILD": "1"}
    res = _launch(tmp_path, data_dir, failing, "second-r1", "search.n_trials=0", shared)
    assert res.returncode == 2 and "built to fail" not in res.stderr, res.stderr  # another search's checkpoints: said first, as before
    assert "holds the checkpoints of search" in res.stderr and "first-r1" in res.stderr, res.stderr
    res = _launch(tmp_path, data_dir, failing, "second-r1", "search.n_trials=0")
    assert res.returncode == 2 and "the space's low corner" in res.stderr and "built to fail" in res.stderr, res.stderr
    before = _imported(imports)
    res = _launch(tmp_path, data_dir, failing, "first-r1", "search.n_trials=0", shared)  # frozen: no preflight to fail
    assert res.returncode == 0, res.stdout + res.stderr
    assert len(_imported(imports) - before) == 1  # its trainer checks alone


def test_check_trainer_imports_the_trainer_once_for_the_launch_s_checks_its_preflight_and_the_conformance_check(data_dir, counted):
    """The three in one fenced child: one import, every build in it; a build that fails is said by the
    preflight, the first to build, and the conformance check is not run after it."""
    imports, env = counted
    res = parcel_hpc(["check-trainer", "counted_trainer:Counted", "--data", str(data_dir), "--steps", "2"], env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "preflight passed" in res.stdout and "serving parity" in res.stdout, res.stdout
    assert len(_imported(imports)) == 1  # the checks, the preflight and the conformance check: one child, one import
    builds = (imports / "built").read_text().split()
    assert set(builds) == _imported(imports) and len(builds) > 2  # the corners' builds and the conformance check's, all there
    before = _imported(imports)
    res = parcel_hpc(["check-trainer", "counted_trainer:Counted", "--data", str(data_dir)], env={**env, "FAIL_BUILD": "1"})
    assert res.returncode == 2 and "the space's low corner" in res.stderr and "built to fail" in res.stderr, res.stderr
    assert "serving parity" not in res.stdout and len(_imported(imports) - before) == 1  # said once, by the preflight
