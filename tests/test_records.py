"""The trial record folded from journal events, and the next-action decision (both pure)."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parcel_hpc import fsio
from parcel_hpc.errors import CorruptRecord
from parcel_hpc.ledger import DeviceUse, Ended, Event, Executor, RecordView, SearchDir, TrialSpec, TrialState, TrialWriter, fold, read_events
from parcel_hpc.ledger.events import Cause
from parcel_hpc.ledger.states import AttemptEnd, MetricResume
from parcel_hpc.lifecycle.actions import Action, RetryPolicy, next_action

SPEC = TrialSpec("t0001", 1, {"lr": 0.1}, 1234, "sha256:" + "1" * 64, "sha256:" + "2" * 64, "sha256:" + "3" * 64, {"gpus": 1, "cpus": 1})


POLICY = RetryPolicy(max_retries=2, max_preemptions=10)
# What the events below leave out (they say only what each test is about).
DEFAULTS = {"submitted": {"executor": "slurm", "launch_id": "l1"}, "admission": {"launch_id": "l1"}}


def ev(kind, t, **kw):
    if kind in ("ended", "resolved") and kw.get("how") == "interrupted":
        kw.setdefault("cause", "timeout")
    return Event.from_json({"kind": kind, "t": t, "writer": "w", "seq": t, **DEFAULTS.get(kind, {}), **kw})


def test_lifecycle_of_a_completed_trial():
    events = [
        ev("submitted", 1, job_id="11"),
        ev("started", 2, attempt=1, job_id="11"),
        ev("milestone", 3, attempt=1, step=10, value=0.5),
        ev("ended", 4, attempt=1, how="completed", metric=0.4, step=82),
    ]
    assert fold(SPEC, events[:1]).state is TrialState.QUEUED
    assert fold(SPEC, events[:2]).state is TrialState.RUNNING
    rec = fold(SPEC, events)
    assert rec.state is TrialState.COMPLETED and rec.metric == 0.4 and rec.step == 82 and rec.jobs == ("11",)


def test_only_a_completed_trial_carries_a_metric():
    rec = fold(SPEC, [ev("started", 1, attempt=1), ev("milestone", 2, attempt=1, step=10, value=0.6), ev("ended", 3, attempt=1, how="pruned", step=10)])
    assert rec.state is TrialState.PRUNED and rec.metric is None and rec.last_value == 0.6
    with pytest.raises(ValueError):
        type(rec)(spec=SPEC, state=TrialState.COMPLETED)


def test_interruption_then_resume():
    events = [
        ev("started", 1, attempt=1),
        ev("ended", 2, attempt=1, how="interrupted", cause="preempted", step=30),
        ev("started", 3, attempt=2),
        ev("resumed", 4, attempt=2, step=30),
    ]
    rec = fold(SPEC, events[:2])
    assert rec.state is TrialState.QUEUED and rec.interrupted == 1
    rec = fold(SPEC, events)
    assert rec.state is TrialState.RUNNING and rec.resumed == 1 and len(rec.attempts) == 2
    assert rec.attempts[1].resumed_from == 30


def test_a_metric_resumed_under_a_declared_tolerance_is_marked_as_such():
    resumed = [ev("started", 1, attempt=1), ev("ended", 2, attempt=1, how="interrupted", step=30), ev("started", 3, attempt=2)]
    done = [ev("ended", 5, attempt=2, how="completed", metric=0.4, step=82)]
    assert fold(SPEC, [ev("started", 1, attempt=1)]).metric_resume is MetricResume.UNINTERRUPTED
    exact = fold(SPEC, [*resumed, ev("resumed", 4, attempt=2, step=30), *done])
    assert exact.metric_resume is MetricResume.EXACT and exact.metric_resume.is_exact()
    drifting = fold(SPEC, [*resumed, ev("resumed", 4, attempt=2, step=30, exact=False), *done])
    assert drifting.metric_resume is MetricResume.WITHIN_TOLERANCE and not drifting.metric_resume.is_exact()
    assert drifting.to_json()["metric_resume"] == "within_tolerance"
    assert exact.metric_resume.mark() == "" and "train.resume_tolerance" in drifting.metric_resume.mark()  # what every view shows beside it


def test_a_trial_carries_its_trainer_s_own_metrics_of_its_latest_step_a_quarantine_withdraws_them():
    events = [
        ev("started", 1, attempt=1),
        ev("milestone", 2, attempt=1, step=10, value=0.6, train={"loss": 0.9}),
        ev("milestone", 3, attempt=1, step=20, value=0.5, train={"loss": 0.7, "lr": 0.01}),
        ev("ended", 4, attempt=1, how="interrupted", cause="preempted", step=25),
        ev("started", 5, attempt=2),
        ev("milestone", 6, attempt=2, step=20, value=0.5, train={"loss": 0.7, "lr": 0.01}),  # resumed before 20: reported again
        ev("milestone", 7, attempt=2, step=30, value=0.4, is_milestone=False, train={"loss": 0.6, "lr": 0.0}),
    ]
    rec = fold(SPEC, events[:3] + events[4:6])
    assert rec.train_metrics == {"loss": 0.7, "lr": 0.01} and rec.to_json()["train_metrics"] == {"loss": 0.7, "lr": 0.01}
    assert fold(SPEC, events).train_metrics == {"loss": 0.6, "lr": 0.0}  # its last step, off the milestone grid too
    assert fold(SPEC, events[:1]).train_metrics == {}
    assert fold(SPEC, [*events, ev("quarantined", 8, reason="shared prefix", attempts_upto=2)]).train_metrics == {}


def test_failure_is_retried_once_then_final():
    first = [ev("started", 1, attempt=1), ev("ended", 2, attempt=1, how="failed", cause="exception", final=False)]
    rec = fold(SPEC, first)
    assert rec.state is TrialState.QUEUED and rec.failures == ("exception",)
    rec = fold(SPEC, first + [ev("started", 3, attempt=2), ev("ended", 4, attempt=2, how="failed", cause="exception", final=True)])
    assert rec.state is TrialState.FAILED and rec.reason == "exception" and len(rec.attempts) == 2


def test_quarantine_withdraws_a_result_and_taints_its_attempts():
    done = [ev("started", 1, attempt=1), ev("ended", 2, attempt=1, how="completed", metric=0.1, step=82)]
    q = ev("quarantined", 3, reason="shared prefix", attempts_upto=1)
    rec = fold(SPEC, done + [q])
    assert rec.state is TrialState.QUARANTINED and rec.metric is None and rec.invalid_metrics
    # a late report from the tainted attempt changes nothing
    late = ev("ended", 4, attempt=1, how="completed", metric=0.05, step=82)
    assert fold(SPEC, done + [q, late]).state is TrialState.QUARANTINED
    clean = [ev("started", 5, attempt=2), ev("ended", 6, attempt=2, how="completed", metric=0.3, step=82)]
    rec = fold(SPEC, done + [q, late] + clean)
    assert rec.state is TrialState.COMPLETED and rec.metric == 0.3 and rec.quarantines == ("shared prefix",)


def test_rejection_and_budget_exhaustion_are_final():
    assert fold(SPEC, [ev("admission", 1, outcome="reject:split_digest")]).reason == "reject:split_digest"
    rec = fold(SPEC, [ev("started", 1, attempt=1), ev("ended", 2, attempt=1, how="budget_exhausted", reason="hold:budget")])
    assert rec.state is TrialState.BUDGET_EXHAUSTED and rec.state.is_finished()


def test_journals_merge_in_time_order_and_survive_a_torn_tail(tmp_path):
    a = TrialWriter(tmp_path, "launch", clock=iter([1.0, 4.0]).__next__)
    b = TrialWriter(tmp_path, "a1", clock=iter([2.0, 3.0]).__next__)
    a.submitted("7", Executor("local"), "l1")
    b.started(1, ev("started", 0).data)
    b.milestone(1, 10, 0.5, True)
    a.gave_up("a limit")
    with open(b.path, "ab") as f:
        f.write(b'{"kind":"ended","t":5')  # the writer was killed mid-append
    assert [e.kind.value for e in read_events(tmp_path)] == ["submitted", "started", "milestone", "gave_up"]


def test_a_record_view_folds_again_only_what_changed(tmp_path):
    """The launch's follower reads every trial each poll through a RecordView: it returns exactly
    what SearchDir.record does, folding a trial again only when one of its journals changed."""
    search = SearchDir(tmp_path)
    search.write_spec(SPEC)
    view = RecordView(search)
    first = view.record("t0001")
    assert first == search.record("t0001") and first.state is TrialState.QUEUED
    assert view.record("t0001") is first  # nothing changed: not read again
    launch = search.writer("t0001", "launch")
    launch.submitted("7", Executor("local"), "l1")
    assert view.record("t0001") == search.record("t0001") and view.record("t0001").jobs == ("7",)
    worker = search.writer("t0001", "a1")  # a new journal
    worker.started(1, ev("started", 0).data)
    worker.ended(1, Ended(AttemptEnd.COMPLETED, metric=0.3, step=82))
    assert view.record("t0001") == search.record("t0001") and view.record("t0001").state is TrialState.COMPLETED


LINES = st.lists(st.dictionaries(st.sampled_from("abc"), st.one_of(st.integers(), st.text(max_size=5), st.lists(st.integers(), max_size=2))), max_size=6)
DAMAGE = st.sampled_from([b"", b'{"kind":"ended","t":5', b"{}", b"\n", b" \n", b"{bad}\n", b'{"a":1},{"b":2}\n', b"[1]\n", b"\n\n"])


@settings(deadline=None)
@given(LINES, DAMAGE, st.integers(0, 6))
def test_the_one_parse_reading_of_a_journal_reads_exactly_what_line_by_line_reading_does(records, damage, where):
    """The journal reader parses whole files at once; whatever the bytes (a torn tail, a blank or
    damaged line anywhere, two records on one line), it returns or refuses exactly as a reading line
    by line does."""
    lines = [json.dumps(r).encode() + b"\n" for r in records]
    data = b"".join(lines[:where]) + damage + b"".join(lines[where:])

    def outcome(read):
        try:
            return read()
        except CorruptRecord as exc:
            return str(exc)

    assert outcome(lambda: fsio.parse_jsonl(data, "j")) == outcome(lambda: list(fsio._parse_lines(data, "j")))


def test_events_are_validated_at_birth():
    with pytest.raises(ValueError):
        Ended(AttemptEnd.COMPLETED)  # a completed attempt without its metric
    with pytest.raises(ValueError):
        Ended(AttemptEnd.FAILED)  # a failure without its class
    with pytest.raises(ValueError):
        Ended(AttemptEnd.INTERRUPTED, cause=Cause.EXCEPTION)  # an interruption names an infrastructure cause
    with pytest.raises(CorruptRecord):
        Event.from_json({"kind": "ended", "t": 1, "writer": "w", "seq": 1, "how": "completed", "metric": 0.1, "cause": "gremlins"})


def _filled(line: dict, value) -> dict:
    """``line`` as a journal line, with ``value`` where it says "BAD" (at its top or in ``train``)."""
    put = {k: ({n: value if x == "BAD" else x for n, x in v.items()} if isinstance(v, dict) else value if v == "BAD" else v) for k, v in line.items()}
    return {"t": 1.0, "writer": "w", "seq": 1, "attempt": 1} | put


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize(
    "line",
    [
        {"kind": "milestone", "step": 10, "value": "BAD"},
        {"kind": "milestone", "step": 10, "value": 0.5, "train": {"loss": "BAD"}},
        {"kind": "ended", "how": "pruned", "milestone": 10, "value": "BAD"},
        {"kind": "ended", "how": "completed", "metric": "BAD"},
        {"kind": "started", "process_started": "BAD"},
        {"kind": "device_use", "devices": ["cpu"], "utilization": "BAD", "samples": 3},
        {"kind": "milestone", "step": 10, "value": 0.5, "t": "BAD"},
    ],
)
def test_a_journal_line_holding_nan_or_an_infinity_is_damaged(line, bad):
    """No writer journals a NaN or an infinity: a non-finite score or training metric fails the
    attempt (``Diverged``, cause diverged), the pruning store refuses one before its milestone is
    journaled, and every journal line is dumped with ``allow_nan=False``. So one read is damage."""
    with pytest.raises(CorruptRecord, match="an event does not parse"):
        Event.from_json(_filled(line, bad))
    assert Event.from_json(_filled(line, 0.5)).kind.value == line["kind"]  # the same line, finite, reads


@pytest.mark.parametrize(
    "events,dispatches,alive,expected",
    [
        ([], 0, False, Action.DISPATCH),
        ([ev("submitted", 1, job_id="1")], 1, True, Action.WAIT),
        ([ev("started", 1, attempt=1)], 1, False, Action.RESOLVE_LOST),
        ([ev("started", 1, attempt=1), ev("ended", 2, attempt=1, how="interrupted", cause="node_fail")], 1, False, Action.RETRY),
        ([ev("started", 1, attempt=1), ev("ended", 2, attempt=1, how="failed", cause="exception")], 1, False, Action.RETRY),
        ([ev("started", 1, attempt=1), ev("ended", 2, attempt=1, how="completed", metric=0.2)], 1, False, Action.NONE),
        ([ev("started", 1, attempt=1), ev("quarantined", 2, attempts_upto=1, reason="x")], 1, False, Action.RETRY),
        ([ev("started", i, attempt=i) if i % 2 else ev("ended", i, attempt=i - 1, how="interrupted") for i in range(1, 9)], 4, False, Action.GIVE_UP),
        ([ev("submitted", 1, job_id="1")], 5, False, Action.GIVE_UP),
    ],
)
def test_next_action(events, dispatches, alive, expected):
    assert next_action(fold(SPEC, events), dispatches=dispatches, job_alive=alive, policy=POLICY).action is expected


def test_a_stale_attempt_ending_late_does_not_change_the_state():
    events = [
        ev("started", 1, attempt=1),
        ev("resolved", 2, attempt=1, how="interrupted", cause="node_fail"),
        ev("started", 3, attempt=2),
        ev("ended", 4, attempt=1, how="lost", cause="superseded"),
    ]
    rec = fold(SPEC, events)
    assert rec.state is TrialState.RUNNING  # attempt 2 runs; attempt 1's late word changes nothing
    assert rec.attempts[0].how.value == "interrupted"  # the first word on how it ended stands


def test_a_late_give_up_never_overrides_a_result():
    events = [
        ev("started", 1, attempt=1),
        ev("ended", 2, attempt=1, how="completed", metric=0.2, step=82),
        ev("gave_up", 3, state="failed", cause="retries_exhausted", reason="late signal"),
    ]
    rec = fold(SPEC, events)
    assert rec.state is TrialState.COMPLETED and rec.metric == 0.2


def test_an_older_attempts_result_still_counts_after_a_newer_one_started():
    events = [
        ev("started", 1, attempt=1),
        ev("resolved", 2, attempt=1, how="lost", cause="lost"),
        ev("started", 3, attempt=2),
        ev("ended", 4, attempt=1, how="completed", metric=0.25, step=82),
    ]
    rec = fold(SPEC, events)
    assert rec.state is TrialState.COMPLETED and rec.metric == 0.25


def test_quarantine_withdraws_failures_made_in_the_shared_directory():
    events = [
        ev("started", 1, attempt=1),
        ev("ended", 2, attempt=1, how="failed", cause="exception", final=False),
        ev("started", 3, attempt=2),
        ev("ended", 4, attempt=2, how="failed", cause="exception", final=True),
        ev("quarantined", 5, attempts_upto=2, reason="shared prefix"),
    ]
    rec = fold(SPEC, events)
    assert rec.state is TrialState.QUARANTINED and rec.failures == () and not rec.state.is_result()


def test_jobs_that_never_start_are_not_retried_forever():
    events = [ev("started", 1, attempt=1), ev("ended", 2, attempt=1, how="interrupted", cause="timeout")]
    rec = fold(SPEC, events)
    assert next_action(rec, dispatches=3, job_alive=False, policy=POLICY).action is Action.RETRY
    assert next_action(rec, dispatches=5, job_alive=False, policy=POLICY).action is Action.GIVE_UP


def test_journals_written_before_the_typed_ledger_still_fold(tmp_path):
    """Lines exactly as the string-typed writers wrote them (a worker rejection said its outcome in
    ``cause``); an existing search keeps loading after the upgrade."""
    lines = [
        '{"executor":"local","job_id":"9","kind":"submitted","launch_id":"l1","seq":1,"t":1.0,"writer":"launch-h-1-a"}',
        '{"attempt":1,"cuda_visible_devices":"","executor":"local","host":"h","job_id":"9","kind":"started","node":"h","pid":9,'
        '"raw_job_id":"9","restart_count":0,"seq":1,"t":2.0,"writer":"a1-h-9-b"}',
        '{"attempt":1,"cause":"reject:image_digest","how":"rejected","kind":"ended","reason":"reject:image_digest","seq":2,"t":3.0,"writer":"a1-h-9-b"}',
    ]
    (tmp_path / "journal-old.jsonl").write_text("\n".join(lines) + "\n")
    rec = fold(SPEC, read_events(tmp_path))
    assert rec.state is TrialState.REJECTED and rec.reason == "reject:image_digest"
    assert rec.attempts[0].device_use is None  # written before workers recorded it: not recorded, not "cpu"


def test_what_an_attempt_used_of_its_gpus_is_journaled_and_folded_onto_that_attempt(tmp_path):
    use = DeviceUse(("NVIDIA H200",), peak_memory_bytes=3 * 2**30, utilization=0.82, samples=41, frameworks={"torch": "2.13.0", "cuda": "12.8"})
    writer = TrialWriter(tmp_path, "a1", clock=iter([1.0, 2.0, 3.0, 4.0, 5.0]).__next__)
    writer.started(1, ev("started", 0).data)
    writer.ended(1, Ended(AttemptEnd.INTERRUPTED, Cause.PREEMPTED, step=40))
    writer.started(2, ev("started", 0).data)
    writer.device_use(2, use)
    writer.ended(2, Ended(AttemptEnd.COMPLETED, metric=0.3, step=82))
    first, second = fold(SPEC, read_events(tmp_path)).attempts
    assert first.device_use is None and second.device_use == use  # read back exactly: the tuple, the mapping
