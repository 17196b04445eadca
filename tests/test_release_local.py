"""Select once, then evaluate, end to end on the embedded local executor with the demo's defaults:
the top candidate loses on crushed_corner and is held, a documented decision releases it, the final
partition is evaluated once (a second attempt is refused), and the packet carries every item.

Every process of the story (the launch, each submitit trial, every selection job) runs with an
audit hook (tests/tracing/sitecustomize.py) that logs each open of the protected final file: only
the one final-evaluation job may appear in that log.
"""

import json
import os
import shutil
from pathlib import Path

import pytest
from browser import check_html_plots

from parcel_hpc.testing import launch, parcel_hpc

TRACING = Path(__file__).parent / "tracing"


def opens_of_final(log_dir: Path) -> list[dict]:
    return [json.loads(line) for p in sorted(log_dir.glob("opens-*.jsonl")) for line in p.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def story(tmp_path_factory, artifacts):
    root = tmp_path_factory.mktemp("release")
    data = root / "data"
    shutil.copytree(artifacts["dir"], data)
    log_dir = root / "opens"
    log_dir.mkdir()
    env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(TRACING), os.environ.get("PYTHONPATH", "")])),
        "PARCEL_TRACE_OPENS": str(log_dir),
        "PARCEL_TRACE_FILES": str(data / "final-group_r8.json"),  # the protected final partition
    }
    # One process, as the demo: which peers a pruning decision sees is a race between processes.
    res = launch([f"search.root={root / 'runs'}", "hydra.launcher.parallelism=1"], cwd=root, data_dir=data, env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    search = root / "runs" / "parcel-search-r1"
    assert opens_of_final(log_dir) == [], "the search itself opened the final partition"
    return {"root": root, "search": search, "env": env, "log_dir": log_dir, "data": data}


def cli(story, *args):
    return parcel_hpc([*args], cwd=story["root"], env=story["env"], timeout=600)


def test_the_whole_story(story):
    search, log_dir = story["search"], story["log_dir"]
    # 1. The final evaluation cannot come before a selection.
    early = cli(story, "evaluate-final", str(search))
    assert early.returncode == 2 and "no selection" in early.stderr
    # 2. select: freezes the list, reruns the winner, retrains the baseline; crushed_corner holds it.
    sel = cli(story, "select", str(search))
    assert sel.returncode == 3, sel.stderr
    assert sel.stdout.splitlines()[0] == "hold:slice-quality"
    assert "damage_type=crushed_corner" in sel.stdout and "FAIL" in sel.stdout
    frozen = json.loads((search / "selection" / "selection-1.json").read_text())
    assert frozen["trial_id"] == "t0077" and not frozen["early"]
    rerun = json.loads((search / "selection" / "1" / "rerun" / "result.json").read_text())
    assert rerun["rerun_metric"] == pytest.approx(frozen["metric"], abs=1e-12)  # same seed, same CPU: exact
    assert rerun["baseline"]["metric"] > frozen["metric"]  # the winner improves the global objective...
    base_crushed = next(r for r in rerun["slices"]["baseline"] if r["value"] == "crushed_corner")
    win_crushed = next(r for r in rerun["slices"]["winner"] if r["value"] == "crushed_corner")
    assert win_crushed["recall"] < base_crushed["recall"] - 0.05  # ...but loses on crushed_corner
    # 3. A second select continues the same selection; later trials could never join it.
    again = cli(story, "select", str(search))
    assert again.returncode == 3 and "selection 1 is frozen" in again.stderr
    assert not (search / "selection" / "selection-2.json").exists()
    # 4. Held: the final partition stays closed, and the refusal is logged.
    held = cli(story, "evaluate-final", str(search))
    assert held.returncode == 3 and held.stdout.splitlines()[0] == "hold:slice-quality"
    assert opens_of_final(log_dir) == []
    # 5. A decision must say who and why in one line; then it lifts the hold.
    bad = cli(story, "decide", str(search), "--accept", "--by", "Dana", "--reason", "two\nlines")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --reason")
    ok = cli(story, "decide", str(search), "--accept", "--by", "Dana Reviewer", "--reason", "crushed_corner loss accepted; corner retraining scheduled")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.splitlines()[0] == "evaluate:final-holdout"
    # 6. The final partition, once.
    final = cli(story, "evaluate-final", str(search))
    assert final.returncode == 0, final.stdout + final.stderr
    assert final.stdout.splitlines()[0] == "evaluate:final-holdout"
    second = cli(story, "evaluate-final", str(search))
    assert second.returncode == 3
    assert second.stdout.splitlines()[0] == "reject:final-holdout-used"
    assert "new search revision needs its own final evaluation plan" in second.stderr
    # No new selection after the final partition was used.
    reselect = cli(story, "select", str(search), "--trial", "t0043", "--reason", "looks better on final")
    assert reselect.returncode in (2, 3)
    # Exactly one process ever opened the final file: the final job of selection 1.
    opens = opens_of_final(log_dir)
    assert opens and all(o["argv"][1:6] == ["selection-job", str(search), "final", "--selection", "1"] for o in opens), opens
    assert all(o["argv"][6:7] == ["--owned"] for o in opens), opens  # the search as select found it
    assert len({o["pid"] for o in opens}) == 1
    # 7. The release packet: registered, with every item.
    rel = cli(story, "release", str(search))
    assert rel.returncode == 0, rel.stdout + rel.stderr
    assert rel.stdout.splitlines()[0] == "release:registered"
    packet = json.loads((search / "release" / "packet.json").read_text())
    assert packet["counts"]["completed"] + packet["counts"]["pruned"] == 82
    assert set(packet["counts"]) >= {"completed", "pruned", "failed", "quarantined", "rejected", "budget_exhausted"}
    # The packet's spend is the one every read command shows, selection jobs included.
    spend = packet["compute"]["spend"]
    assert spend["cpu_hours"] > 0 and spend["parts"]["selection_jobs"]["cpu_hours"] > 0 and spend["parts"]["held"]["cpu_hours"] == 0
    assert spend == json.loads(cli(story, "status", str(search), "--json").stdout)["spend"]
    assert spend == json.loads(cli(story, "reconcile", str(search), "--json").stdout)["campaigns"][0]["spend"]
    assert f"Compute: {packet['compute']['line']}." in (search / "release" / "packet.md").read_text()
    lineage = packet["lineage"]
    assert set(lineage) == {"what_ran", "on_what_data", "how_it_ended", "what_it_cost", "what_was_concluded", "refit"}
    assert lineage["refit"] is None and lineage["on_what_data"]["split_method"] == "group"  # one validation partition: the trial itself ships
    contract = json.loads((search / "contract.json").read_text())["contract"]
    assert lineage["on_what_data"]["snapshot_digest"] == contract["snapshot_digest"]
    assert lineage["what_ran"]["dependencies"]["environment_digest"] == lineage["what_ran"]["image_digest"] == contract["image_digest"]
    proposed = lineage["what_ran"]["proposed_by"]  # how the winner was proposed: random, trial i of the search seed
    assert proposed["sampler"] == "random" and f"t{proposed['index']:04d}" == lineage["what_ran"]["trial_id"]
    assert proposed["space_digest"] == contract["space"]["digest"] and proposed["proposal"] is None
    assert packet["rerun"]["within"] and packet["rerun"]["tolerance"] == 0.02
    assert packet["slices"]["passed"] is False and packet["checks"]["slices"] == "decided"
    assert packet["parity"]["passed"] and packet["serving"]["latency_ms_per_image"] > 0 and packet["serving"]["artifact_bytes"] > 0
    assert packet["final"]["winner"]["metric"] >= 0 and packet["final"]["final_examples"] > 0
    assert [a["allowed"] for a in packet["final_attempts"]] == [False, True, False]  # every attempt is logged
    assert [o["job_id"] for o in packet["final_opened"]] == [str(opens[0]["pid"])]  # and the one read, by the job that made it
    entry = Path(packet["registry_path"])
    assert (entry / "artifact.h5").stat().st_size == packet["serving"]["artifact_bytes"]
    assert (entry / "registered.json").exists() and (entry / "packet.html").exists()
    md = (search / "release" / "packet.md").read_text()
    assert "crushed_corner" in md and "Dana Reviewer" in md
    assert f"proposed by random, trial {proposed['index']} of the search seed, space `{contract['space']['digest']}`" in md
    check_html_plots(
        search / "release" / "packet.html",
        story["root"],
        at_least=3,
        sections=('id="checks"', 'id="lineage"', 'id="slices"', 'id="parity"', 'id="serving"', 'id="final"', 'id="rerun"'),
    )
