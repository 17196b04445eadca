"""The release packet and the registry gate.

packet.py     build(): the packet as one JSON value from the search's records; outcome_of(), the registry gate
render.py     Markdown and a self-contained HTML page with plots (templates/)
publish.py    write the packet beside the search; register the artifact only when every check passed or was decided
folder.py     the folder registry (the embedded default): an entry written whole, checked when found
mlflow_registry.py  the MLflow Model Registry: one version per released selection, its artifacts a folder entry
serving.py    load_release(): a registry entry back to a trainer that serves, from the code it holds
"""

from parcel_hpc.release.packet import build, outcome_of
from parcel_hpc.release.publish import publish
from parcel_hpc.release.serving import load_release

__all__ = ["build", "load_release", "outcome_of", "publish"]
