"""One spend, accounted once, on real local launches: every read command prints the same figure, and
a hold left on an ended attempt is flagged by ``reconcile`` (which writes nothing) and settled by
``sync``."""

import csv
import io
import json
import re
from pathlib import Path

import pytest

from parcel_hpc.budget import BudgetLedger, KeyState
from parcel_hpc.ledger import SearchDir
from parcel_hpc.testing import launch, parcel_hpc

LINE = re.compile(
    r"spend\W+(\d+\.\d{4}) GPU-h, (\d+\.\d{4}) CPU-h, cost (\d+\.\d{4}) \((?:GPU|CPU)-h: attempts \S+ \+ start up and gaps \S+ \+ selection jobs \S+ \+ held \S+\)"
)


def finished(tmp_path, data_dir, rev, *overrides) -> tuple[Path, str]:
    """The search directory, and what the launch printed."""
    res = launch([f"search.root={tmp_path / 'runs'}", f"search.revision={rev}", *overrides], cwd=tmp_path, data_dir=data_dir)
    assert res.returncode == 0, res.stderr[-2000:]
    return tmp_path / "runs" / rev, res.stdout


def ok(*argv) -> str:
    res = parcel_hpc([str(a) for a in argv])
    assert res.returncode == 0, (argv, res.stdout[-2000:], res.stderr[-2000:])
    return res.stdout


def shown_spends(search: Path) -> dict[str, dict]:
    """The spend each read command prints for ``search``, from its JSON."""
    (listed,) = json.loads(ok("list", search.parent, "--json"))["searches"]
    (recon,) = json.loads(ok("reconcile", search, "--json"))["campaigns"]
    return {"list": listed["spend"], "status": json.loads(ok("status", search, "--json"))["spend"], "reconcile": recon["spend"]}


def printed(text: str) -> tuple[str, str, str]:
    found = LINE.search(text)
    assert found, text[-2000:]
    return found.groups()


def test_every_read_command_shows_one_spend_whose_parts_add_up(tmp_path, data_dir):
    search, launched = finished(tmp_path, data_dir, "packed", "search.n_trials=4", "pruner=none", "hydra.launcher.pack_size=2")
    spends = shown_spends(search)
    first = spends["status"]
    assert all(s == first for s in spends.values()), spends
    parts = first["parts"]
    assert first["cpu_hours"] > 0 and parts["start_up_and_gaps"]["cpu_hours"] > 0  # each job's start-up, a gap between its two trials
    assert parts["held"] == {"gpu_hours": 0.0, "cpu_hours": 0.0, "cost": 0.0} and first["stale_holds"] == 0
    for unit in ("gpu_hours", "cpu_hours", "cost"):
        assert first[unit] == pytest.approx(sum(p[unit] for p in parts.values()), abs=1e-5)
    # The caps bind the journal: what the attempts settled, and nothing still held.
    totals = BudgetLedger.read_totals(search)
    assert first["charged"]["cpu_hours"] == pytest.approx(totals.used_cpu_hours + totals.reserved_cpu_hours, abs=1e-6)
    assert parts["attempts"]["cpu_hours"] == pytest.approx(totals.used_cpu_hours, abs=1e-6)  # every attempt reserved and settled
    # The same line, the same rounding, in the text of status, reconcile and the launch's summary.
    line = printed(ok("status", search))
    assert line == (f"{first['gpu_hours']:.4f}", f"{first['cpu_hours']:.4f}", f"{first['cost']:.4f}")
    assert printed(ok("reconcile", search)) == line
    assert printed(launched) == line
    # export: its attempt rows add up to the trials' own attempts and what they hold.
    rows = list(csv.DictReader(io.StringIO(ok("export", search, "--attempts"))))
    assert sum(float(r["cpu_hours"]) for r in rows) == pytest.approx(parts["attempts"]["cpu_hours"], abs=1e-5)
    assert sum(float(r["held_cpu_hours"]) for r in rows) == pytest.approx(parts["held"]["cpu_hours"], abs=1e-5)
    trials = list(csv.DictReader(io.StringIO(ok("export", search))))
    assert sum(float(r["cost"]) for r in trials) == pytest.approx(parts["attempts"]["cost"], abs=1e-5)


def test_a_hold_left_on_an_ended_attempt_is_flagged_by_reconcile_and_settled_by_sync(tmp_path, data_dir):
    search, _ = finished(tmp_path, data_dir, "stale", "search.n_trials=2", "pruner=none")
    before = shown_spends(search)["status"]
    # An older parcel_hpc resolved an attempt ``lost`` and never settled it: its settle entry is not there.
    journal = search / "budget" / "journal"
    last = sorted(journal.glob("*.json"))[-1]
    entry = json.loads(last.read_text())
    assert entry["kind"] == "settle"
    last.unlink()
    key = f"{entry['trial_id']}/{entry['attempt']}"
    held = BudgetLedger.read(search).totals.reserved_cpu_hours
    assert held > 0
    spends = shown_spends(search)
    assert all(s == spends["status"] for s in spends.values()), spends
    stale = spends["status"]
    assert stale["stale_holds"] == 1 and stale["parts"]["held"]["cpu_hours"] == pytest.approx(held, abs=1e-6)
    assert stale["cpu_hours"] > before["cpu_hours"]  # the worst case is still charged
    (recon,) = json.loads(ok("reconcile", search, "--json"))["campaigns"]
    (flag,) = [f for f in recon["flags"] if f["kind"] == "stale_hold"]
    assert flag["trial_id"] == entry["trial_id"] and f"attempt {entry['attempt']} ended" in flag["detail"]
    assert f"`parcel-hpc sync {search}`" in flag["detail"]
    assert not (journal / last.name).exists()  # reconcile wrote nothing
    out = ok("sync", search)
    assert f"{key}: settled the budget hold" in out and "settled 1 budget holds" in out
    view = BudgetLedger.read(search)
    assert view.totals.reserved_cpu_hours == 0 and all(h.state is KeyState.SETTLED for h in view.holds.values())
    (recon,) = json.loads(ok("reconcile", search, "--json"))["campaigns"]
    assert not [f for f in recon["flags"] if f["kind"] == "stale_hold"]
    after = shown_spends(search)["status"]
    assert after == before  # settled with the hours the ledger saw: the same figure as the worker's own settle
    assert "settled 0 budget holds" in ok("sync", search)  # idempotent
    assert SearchDir(search).record(entry["trial_id"]).state.value == "completed"
