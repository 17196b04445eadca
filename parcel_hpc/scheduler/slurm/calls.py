"""How often this process asked SLURM, by command. SLURM rate-limits each user's RPCs, so a launch
reports what it asked (the launch summary and its launch record) and the follower asks at most once
per ``MIN_ROUND_S`` whatever the number of its jobs or slots."""

from __future__ import annotations

from collections import Counter

MIN_ROUND_S = 2.0  # a follow round's squeue at most this often: about 30 a minute per job name
CALLS: Counter[str] = Counter()


def count(command: str) -> None:
    CALLS[command] += 1
