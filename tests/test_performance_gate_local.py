"""A winner worse than the approved baseline on validation is held at ``select``, before the final
partition can be claimed, with its rule and numbers; a documented decision lifts it; a final-partition
rule pinned in the contract is a decidable hold, never a dead end (issue 45's user story, on the
built-in model: an 8-trial search whose best trial loses to the baseline overall and on slices).
"""

import json
import shutil

import pytest
from browser import check_html_plots

from parcel_hpc.ledger import SearchDir
from parcel_hpc.selection.gates import FinalPerformance, Performance, Slices
from parcel_hpc.selection.store import FINAL_RESULT, SelectionStore
from parcel_hpc.testing import launch, parcel_hpc


@pytest.fixture(scope="module")
def search(tmp_path_factory, artifacts):
    root = tmp_path_factory.mktemp("performance")
    shutil.copytree(artifacts["dir"], root / "data")
    res = launch(
        [
            f"search.root={root / 'runs'}",
            "search.revision=pilot-r1",
            "budget.max_trials=8",
            "selection.final_performance_margin=0",
            "hydra.launcher.parallelism=1",
        ],
        cwd=root,
        data_dir=root / "data",
    )
    assert res.returncode == 0, res.stderr[-2000:]
    # What the winner will be held to is said at the launch, before any trial runs.
    said = " ".join(res.stdout.split())
    assert (
        "held to at most 0 above the baseline's validation miss-cost" in said
        and "the final result: at most 0 above the baseline's miss-cost (else hold:final-performance)" in said
    )
    return root / "runs" / "pilot-r1"


def lines(res) -> list[str]:
    assert "Traceback" not in res.stdout + res.stderr, res.stderr
    return [line.strip() for line in res.stdout.splitlines()]


def test_a_winner_worse_than_the_baseline_is_held_at_select_decided_then_released(search, tmp_path):
    sel = parcel_hpc(["select", str(search)])
    said = lines(sel)
    assert sel.returncode == 3 and said[0] == "hold:performance", sel.stdout + sel.stderr
    result = json.loads((search / "selection" / "1" / "rerun" / "result.json").read_text())
    winner, baseline = result["artifact_metric"], result["baseline"]["metric"]
    assert winner > baseline  # the case: worse than the approved baseline on validation
    # The rule with the pinned margin, the numbers, and what lifts it, right after the outcome.
    assert said[2] == f"rule (performance): {Performance.definition} (0)"
    assert (
        said[3]
        == f"found: validation miss-cost winner {winner:.4f}, baseline {baseline:.4f}, limit {baseline:.4f} (baseline + 0): over by {winner - baseline:.4f}"
    )
    assert said[4].startswith("to lift it: `parcel-hpc decide")
    # evaluate-final is refused while the hold stands, and the final partition is not claimed.
    held = parcel_hpc(["evaluate-final", str(search)])
    assert held.returncode == 3 and lines(held)[0] == "hold:performance"
    assert SelectionStore(SearchDir(search)).final_claim() is None and not (search / FINAL_RESULT).exists()
    # One decision per hold: performance, then the slices this winner also fails.
    first = parcel_hpc(["decide", str(search), "--accept", "--by", "Dana", "--reason", "pilot: the smaller model is accepted at a higher miss-cost"])
    said = lines(first)
    assert first.returncode == 3 and said[0] == "hold:slice-quality", first.stdout + first.stderr
    assert said[2] == f"rule (slices): {Slices.definition}" and said[3].startswith("found: ") and "slice checks on validation failed" in said[3]
    assert "checks: data passed, reproducible passed, parity passed, performance decided, slices FAILED" in said
    second = parcel_hpc(["decide", str(search), "--accept", "--by", "Dana", "--reason", "slice losses accepted for the pilot"])
    assert second.returncode == 0 and lines(second)[0] == "evaluate:final-holdout", second.stdout + second.stderr
    # A decision cannot lift what is not decidable, nor anything once nothing holds.
    nothing = parcel_hpc(["decide", str(search), "--accept", "--by", "Dana", "--reason", "again"])
    assert nothing.returncode == 2 and "evaluate:final-holdout" in nothing.stderr
    final = parcel_hpc(["evaluate-final", str(search)])
    assert final.returncode == 0, final.stdout + final.stderr
    sealed = json.loads((search / FINAL_RESULT).read_text())
    f_winner, f_baseline = sealed["winner"]["metric"], sealed["baseline"]["metric"]
    assert f_winner > f_baseline  # worse on the final partition too: the pinned final rule holds it
    # The contract's final rule: a hold with its rule and numbers, nothing registered, and decidable.
    rel = parcel_hpc(["release", str(search)])
    said = lines(rel)
    assert rel.returncode == 3 and said[0] == "hold:final-performance", rel.stdout + rel.stderr
    assert said[1] == f"rule (final-performance): {FinalPerformance.definition} (0)"
    assert said[2].startswith(f"found: final miss-cost winner {f_winner:.4f}, baseline {f_baseline:.4f}, limit {f_baseline:.4f}")
    assert not (search.parent / "registry").exists()
    late = parcel_hpc(["decide", str(search), "--accept", "--by", "Dana", "--reason", "final: within the noise we accept for the pilot"])
    assert late.returncode == 0 and lines(late)[0] == "decided: hold:final-performance lifted for t0002 by Dana", late.stdout + late.stderr
    rel = parcel_hpc(["release", str(search)])
    assert rel.returncode == 0 and lines(rel)[0] == "release:registered", rel.stdout + rel.stderr
    # The packet says each check's rule, numbers and verdict, and each decision, in JSON, Markdown and HTML.
    packet = json.loads((search / "release" / "packet.json").read_text())
    gates = {g["gate"]: g for g in packet["gates"]}
    assert packet["checks"] == {name: g["check"] for name, g in gates.items()}
    assert [gates[n]["check"] for n in ("performance", "slices", "final-performance")] == ["decided"] * 3
    assert gates["performance"]["rule"] == f"{Performance.definition} (0)" and f"winner {winner:.4f}" in gates["performance"]["found"]
    assert [d["lifted"] for d in packet["selection"]["decisions"]] == ["hold:performance", "hold:slice-quality", "hold:final-performance"]
    markdown = (search / "release" / "packet.md").read_text()
    assert f"validation miss-cost winner {winner:.4f}, baseline {baseline:.4f}" in markdown
    # Once the final evaluation is claimed, a decision lifts nothing but the final rule.
    after = parcel_hpc(["decide", str(search), "--accept", "--by", "Dana", "--reason", "one more"])
    assert after.returncode == 3 and lines(after)[0] == "reject:final-holdout-used", after.stdout + after.stderr
    dom = check_html_plots(search / "release" / "packet.html", tmp_path, 0, ["final-performance"])
    assert f"{Performance.definition} (0)".replace("'", "&#39;") in dom or f"{Performance.definition} (0)" in dom
