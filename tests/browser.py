"""HTML pages the toolkit writes, loaded in headless Chromium (Debian's package) with no network."""

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

_PROBE = (
    "<script>window.addEventListener('load', () => { const imgs = [...document.images];"
    " document.title = 'probe:' + imgs.length + ':' + imgs.filter(i => i.complete && i.naturalWidth > 0).length; });</script>"
)


def check_html_plots(page: Path, workdir: Path, at_least: int, sections: Sequence[str] = ()) -> str:
    """Load ``page`` and read back what Chromium rendered: at least ``at_least`` images, every one
    decoded, and each of ``sections`` in the DOM. Any request off this machine fails to resolve.
    Returns the rendered DOM."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        if os.environ.get("PARCEL_REQUIRE_CHROMIUM"):
            pytest.fail("chromium is not installed: scripts/test.sh installs it")
        pytest.skip("chromium is not installed (scripts/test.sh installs it)")
    probe = workdir / f"probe-{page.stem}.html"
    probe.write_text(page.read_text().replace("</body>", _PROBE + "</body>"))
    argv = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--host-resolver-rules=MAP * ~NOTFOUND",  # no network: a page that needs one shows it here
        "--virtual-time-budget=5000",
        "--dump-dom",
        probe.as_uri(),
    ]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-1000:]
    dom = out.stdout
    title = dom.split("<title>", 1)[1].split("</title>", 1)[0]
    _, total, decoded = title.split(":")
    assert int(total) >= at_least and decoded == total, title  # every plot decoded
    for section in sections:
        assert section in dom, section
    return dom
