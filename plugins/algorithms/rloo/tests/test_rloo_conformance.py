"""RLOO against rlcore's algorithm and plugin-module conformance checks."""

from __future__ import annotations

import pytest

from rlcore.testing.conformance import check_algorithm, check_plugin_module
from rlcore_rloo.algorithm import RLOO


def test_rloo_plugin_module():
    assert check_plugin_module("rlcore_rloo.plugin") == {
        "algorithm/rloo": "rlcore_rloo.algorithm:RLOO"
    }


@pytest.mark.parametrize(
    "options", [{}, {"use_kl_loss": True, "loss_agg_mode": "seq-mean-token-mean"}]
)
def test_rloo_conformance(options):
    check_algorithm(RLOO, RLOO.Config(**options))
