"""The plugin contract's version: what a plugin module declares, and what each version changed."""

from __future__ import annotations

from typing import Final

#: The plugin contract this rlcore implements. A plugin module declares the version it was
#: written for (``contract_version = 2`` at module level); discovery refuses any other.
CONTRACT_VERSION: Final = 2

#: Where every refusal points: the migration note of each version.
CONTRACT_NOTE: Final = "see core/README.md, Contract versions"

#: What each version changed, for the refusal line of a plugin written for an older one.
CONTRACT_CHANGES: Final[dict[int, str]] = {
    1: "the first contract (the Base* classes of rlcore.interfaces)",
    2: (
        "BaseEngine.forward_backward and compute_log_prob take the keyword-only argument "
        "temperature, optimizer_step the keyword-only lr (the core computes the learning rate); "
        "algorithms declare BaseAlgorithm.needs, rollouts BaseRollout.traits and "
        "dispatch_info(), plugin modules contract_version"
    ),
}
