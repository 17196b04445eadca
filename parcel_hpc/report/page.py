"""The search report as one self-contained HTML page: jinja2 over ``data``'s values, with
``plots``' figures inlined as PNG data URIs (the page opens with no network and runs no script).

Pure formatting and plotting of the values it is given: nothing here reads the search directory.
"""

from __future__ import annotations

import datetime as _dt

import jinja2

from parcel_hpc.plotting import png_of
from parcel_hpc.report.data import SearchFacts, cause_counts, state_counts
from parcel_hpc.report.importance import importance
from parcel_hpc.report.plots import figures

# Every value is HTML-escaped: a parameter's value or a trial id is anyone's text.
_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("parcel_hpc.report", "templates"),
    autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",), default=True),
    undefined=jinja2.StrictUndefined,
)


def to_html(facts: SearchFacts, now: float) -> str:
    """The page as of ``now`` (epoch s: when it says it was made)."""
    shares = importance(facts)
    plots = {name: png_of(fig) for name, fig in figures(facts, shares).items()}
    return _ENV.get_template("report.html.j2").render(
        facts=facts,
        states=state_counts(facts),
        causes=cause_counts(facts),
        importance=shares,
        plots=plots,
        generated=_dt.datetime.fromtimestamp(now, _dt.UTC).isoformat(timespec="seconds"),
    )
