"""The search report: one self-contained HTML page (``parcel-hpc report SEARCH --html FILE``) of how
a search went, finished or still running.

    data.py        the report's figures as typed values, built from the trials' records and events (pure)
    importance.py  parameter importance: Optuna's fANOVA on the completed trials, or why there is none
    plots.py       the matplotlib figures of those values, readable at 3 trials and at 10,000
    page.py        the page: jinja2 over the values and the figures as PNG data URIs
    templates/     report.html.j2

Nothing here writes under a search; ``commands/report.py`` reads it and writes the page.
"""
