"""The worker image digest: which software a trial ran with.

Three kinds, chosen by the ``image`` config group:
- ``computed``: digest of the installed distributions (name==version, sorted) plus the bytes of
  parcel_hpc's own source files, computed where it runs: a worker on a node with another
  environment computes another digest and is rejected;
- ``archive``: sha256 of an image archive file (e.g. an Apptainer .sif): a newer archive at the
  same path has another digest;
- ``given``: a container digest the user pins (``sha256:...``), trusted as written and checked by the
  worker against ``PARCEL_IMAGE_DIGEST`` when the runtime sets it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
from collections.abc import Mapping
from pathlib import Path

from parcel_hpc.errors import UsageError

_PACKAGE_ROOT = Path(__file__).resolve().parent


def environment_digest() -> str:
    h = hashlib.sha256()
    dists = sorted({f"{name}=={version}".lower() for name, version in map(name_and_version, importlib.metadata.distributions()) if name})
    for line in dists:
        if not line.startswith("parcel_hpc=="):  # our own source is hashed below, byte for byte
            h.update(line.encode() + b"\n")
    for path in sorted(_PACKAGE_ROOT.rglob("*.py")):
        h.update(str(path.relative_to(_PACKAGE_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return "sha256:" + h.hexdigest()


def name_and_version(dist: importlib.metadata.Distribution) -> tuple[str | None, str | None]:
    """A distribution's Name and Version, as ``dist.metadata`` gives them, from its metadata's header
    lines alone: ``metadata`` runs the email parser over the whole file (long descriptions too), a
    fifth of a second for an environment's hundred-odd distributions, paid by every launch and job."""
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or dist.read_text("") or ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line:
            break  # the headers end at the first empty line (one of spaces continues a header)
        key, sep, value = line.partition(":")
        if sep and key.lower() in ("name", "version"):  # as the email parser: any case, the first one, leading blanks off
            fields.setdefault(key.lower(), value.lstrip())
    return fields.get("name"), fields.get("version")


def file_digest(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except FileNotFoundError:
        raise UsageError(f"image archive {path} does not exist; set image.path to the worker image archive") from None
    return "sha256:" + h.hexdigest()


def image_digest(image_cfg: Mapping) -> str:
    """The digest this process sees for the configured image."""
    kind = image_cfg.get("kind", "computed")
    if kind == "computed":
        return environment_digest()
    if kind == "archive":
        return file_digest(image_cfg["path"])
    if kind == "given":
        digest = str(image_cfg.get("digest") or "")
        if not digest.startswith("sha256:") or len(digest) != 71:
            raise UsageError(f"image.digest={digest!r} is not a sha256 container digest; set image.digest=sha256:<64 hex>")
        return os.environ.get("PARCEL_IMAGE_DIGEST", digest)
    raise UsageError(f"image.kind={kind!r} is unknown; use image=computed, image=archive or image=given")
