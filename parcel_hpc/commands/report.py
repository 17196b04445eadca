"""``parcel-hpc report SEARCH --html FILE``: how a search went, as one self-contained HTML page.

Optimization history (best so far against trials finished and against hours spent), every trial's
milestone curves with the pruned ones marked, parallel coordinates of the parameters, parameter
importance, states and failure classes, and the distributions of queue wait and attempt duration
(``parcel_hpc.report``). A running search is reported as it stands.

Must not write under the search: it reads the ledger and the budget journal, and writes only FILE,
whole or not at all.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from parcel_hpc import fsio
from parcel_hpc.accounting.spend import search_spend, selection_jobs
from parcel_hpc.budget import BudgetLedger, search_caps
from parcel_hpc.ledger import SearchDir
from parcel_hpc.propose.specs import space_of
from parcel_hpc.report.data import SearchFacts, facts_of
from parcel_hpc.report.page import to_html

READ_ONLY = True


def read(search: SearchDir) -> SearchFacts:
    """The report's values, read without writing."""
    contract = search.contract()
    trials = list(search.histories())
    journal = BudgetLedger.read(search.path)
    spend = search_spend([r for r, _ in trials], journal, selection_jobs(search), search_caps(contract).rates)
    return facts_of(contract["search_revision"], space_of(contract)[0], trials, journal.holds if journal is not None else {}, spend.line())


def report(search: SearchDir, html: Path, now: float) -> SearchFacts:
    fsio.check_output(html, "--html")  # a wrong path costs nothing
    facts = read(search)
    fsio.write_output(html, to_html(facts, now).encode(), "--html")
    return facts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("search_dir", type=Path)
    parser.add_argument("--html", type=Path, metavar="FILE", required=True, help="write the page here (plots inlined: it opens with no network)")


def run(args: argparse.Namespace) -> int:
    facts = report(SearchDir(args.search_dir), args.html, time.time())
    print(f"wrote the report of {len(facts.trials)} trials to {args.html}", file=sys.stderr)
    return 0
