from __future__ import annotations

import os
import sys
from typing import Any

from rlcore.interfaces import BaseReward


class ExitReward(BaseReward):
    """Exits the process like a careless script once the marker file exists; until then
    scores the parity of the response length (varied scores: non-zero advantages)."""

    def score(
        self,
        data_source: str,
        solution_str: str,
        ground_truth: str,
        extra_info: dict[str, Any] | None = None,
    ) -> float:
        marker = os.environ.get("RLCORE_TEST_EXIT_MARKER", "")
        if marker and os.path.exists(marker):
            sys.exit(3)
        return float(len(solution_str) % 2)
