"""How every entry point ends on an error: one line on stderr and the project's exit code."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from .errors import GovernanceRefusal, ParcelError


def one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


@contextlib.contextmanager
def exit_on_error() -> Iterator[None]:
    try:
        yield
    except GovernanceRefusal as exc:
        # The outcome string comes first so scripts can match on it.
        print(exc.outcome)
        if exc.detail:
            print(f"{exc.outcome}: {one_line(exc.detail)}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    except ParcelError as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    except KeyboardInterrupt:
        print("interrupted: trials already dispatched keep running; `parcel-hpc status SEARCH_DIR` tells their state", file=sys.stderr)
        raise SystemExit(130) from None
