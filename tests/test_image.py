"""The computed image digest: which software a trial ran with, read the same way however it is computed."""

import importlib.metadata
from pathlib import Path

from parcel_hpc.governance import image
from parcel_hpc.trainer import code


def test_each_distribution_s_name_and_version_are_its_metadata_s():
    dists = list(importlib.metadata.distributions())
    assert len(dists) > 50  # the test environment: the digest covers every one
    for dist in dists:
        assert image.name_and_version(dist) == (dist.metadata["Name"], dist.version), dist.metadata["Name"]


def test_only_the_headers_count_not_a_description_that_looks_like_them(tmp_path):
    info = tmp_path / "demo-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: Demo_Pkg\nVersion: 1.0\nSummary: x\n\nName: not-this\nVersion: 9.9\n")
    dist = importlib.metadata.PathDistribution(info)
    assert image.name_and_version(dist) == ("Demo_Pkg", "1.0") == (dist.metadata["Name"], dist.version)
    (info / "METADATA").write_text("name: lower\nVERSION:  2.0  \nName: second\n\nName: no\n")  # any case, the first one
    assert image.name_and_version(dist) == ("lower", "2.0  ") == (dist.metadata["Name"], dist.version)
    (info / "METADATA").unlink()
    (info / "PKG-INFO").write_text("Name: egg\nVersion: 0.1\n")  # an egg-info's file
    assert image.name_and_version(dist) == ("egg", "0.1")


def test_the_digest_is_stable_within_one_environment():
    assert image.environment_digest() == image.environment_digest()
    assert image.environment_digest().startswith("sha256:") and len(image.environment_digest()) == 71


def test_a_changed_source_file_changes_the_digest(tmp_path, monkeypatch):
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(image, "_PACKAGE_ROOT", Path(root))
    before = image.environment_digest()
    (root / "a.py").write_text("x = 2\n")
    assert image.environment_digest() != before


def test_each_top_level_module_s_distributions_are_the_standard_library_s():
    """The trainer's third-party imports are pinned through ``trainer.code._packages``: the same map as
    ``importlib.metadata.packages_distributions`` here, and for the paths a plain split would misread."""
    assert code._packages() == importlib.metadata.packages_distributions()


def test_a_distribution_s_tops_from_its_record_as_the_standard_library_reads_them(tmp_path):
    info = tmp_path / "odd-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Name: odd\nVersion: 1.0\n")
    rows = [
        "odd/__init__.py,,",
        "single.py,sha256=x,1",
        '"comma,name.py",,',
        "./dotted/x.py,,",
        "../../bin/tool.py,,",
        "data/notes.txt,,",
        ".py,,",
        "pkg//a.py,,",
        "trail/x.py/.,,",
        "odd-1.0.dist-info/RECORD,,",
    ]
    (info / "RECORD").write_text("\n".join(rows) + "\n")
    dist = importlib.metadata.PathDistribution(info)
    stdlib = {f.parts[0] if len(f.parts) > 1 else f.with_suffix("").name for f in dist.files or [] if f.suffix == ".py"}
    assert code._inferred_tops(dist) == stdlib == {"odd", "single", "comma,name", "dotted", "..", "pkg", "trail"}
