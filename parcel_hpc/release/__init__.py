"""The release packet and the registry gate.

packet.py     build(): the packet as one JSON value from the search's records; outcome_of(), the registry gate
render.py     Markdown and a self-contained HTML page with plots (templates/)
publish.py    write the packet beside the search; register the artifact only when every check passed or was decided
"""

from parcel_hpc.release.packet import build, outcome_of
from parcel_hpc.release.publish import publish

__all__ = ["build", "outcome_of", "publish"]
