"""What the SLURM tests of searches share: a running trial to preempt, the check that each
preempted attempt's successor resumed where it stopped (the uninterrupted reference run is
tests/reference.py's), and the jobs a selection submitted."""

from parcel_hpc.ledger import JobRole, SearchDir
from parcel_hpc.ledger.selection import JobSubmitted, SelectionRecord


def running_past(search: SearchDir, step: int) -> str | None:
    """The nodes (``n1,n3``) of every running trial that has a checkpoint at ``step`` or later (None: none
    yet): preempting them all, not one, leaves no chance that each trial on one node ends first."""
    nodes = set()
    for tid in search.trial_ids():
        rec = search.record(tid)
        ckpts = sorted((search.path / "checkpoints" / tid).glob("ckpt-*.h5"))
        started = [e for e in search.events(tid) if e.kind.value == "started"]
        if rec.state.value == "running" and ckpts and int(ckpts[-1].stem.split("-")[1]) >= step and started:
            nodes.add(started[-1].data.node)
    return ",".join(sorted(nodes)) or None


def preempted_and_resumed(records) -> list:
    """The records with a preempted attempt, each checked to have resumed at the step it saved."""
    preempted = [r for r in records if any(a.cause is not None and a.cause.value == "preempted" for a in r.attempts)]
    assert preempted, [(r.trial_id, [(a.how, a.cause) for a in r.attempts]) for r in records]
    for r in preempted:
        interrupted = next(a for a in r.attempts if a.cause is not None and a.cause.value == "preempted")
        resumed = r.attempts[r.attempts.index(interrupted) + 1]
        assert resumed.resumed_from == interrupted.step > 0  # saved at the step boundary after the signal
    return preempted


def submitted_jobs(record: SelectionRecord, role: JobRole) -> list[JobSubmitted]:
    """The jobs of ``role`` the first selection submitted, in order."""
    return [e for e in record.jobs[(1, role)] if isinstance(e, JobSubmitted)]
