"""Conformance suites a plugin author runs against a new engine, rollout, reward or algorithm.

Each check is a plain function that raises :class:`AssertionError` naming the contract rule
broken (``<class>: <rule>: <what was seen>``), so it reads well in any test runner. No pytest
import here (importing the package loads torch, through ``rlcore.protocol``; transformers
loads only inside the engine and rollout checks). A third
party calls them from its own tests::

    from rlcore.testing.conformance import check_algorithm, check_plugin_module, check_reward
    from my_pkg.reward import MyReward

    def test_plugin_module():
        check_plugin_module("my_pkg.plugin")        # light import, well-formed hooks

    def test_reward_conformance():
        check_reward(MyReward, cases=[("... #### 7", "7", 1.0)])

    def test_engine_conformance(tmp_path):
        from rlcore.testing.tiny_model import build_tiny_model
        path = build_tiny_model(tmp_path / "m", hidden=64, layers=1, heads=2, kv_heads=1)
        check_engine(MyEngine, model_path=str(path))

What each checks (see the function docstrings for the exact rules):

- :func:`check_plugin_module` — the entry module declares the current contract version
  (:func:`check_contract`), imports nothing heavy (torch, transformers, ray, vllm, sglang)
  and its hooks return ``name -> "module:Class"``.
- :func:`check_signatures` (run by every ``check_<kind>``) — each abstract method of the
  base that the class implements takes the base's keyword-only parameters (an engine written
  for contract 1 lacks ``forward_backward``'s ``temperature``).
- :func:`check_reward` — ``Config`` rules; ``score`` returns a float or a dict with a float
  ``score``, is deterministic, never raises on adversarial text and returns in time; the
  reward pickles (the scoring pool); optional author cases.
- :func:`check_batch_reward` — for a batched scorer: ``Config`` rules; ``score_batch``
  returns ``BatchScores`` with one score per row ((B,) or (B, R), one kind), floating-point
  and finite, extras one per row, finite metrics, in time, on adversarial rows and on a
  batch of one; optional author cases. :func:`make_reward_batch` lays out a
  ``RewardBatch`` from texts for a scorer's own tests.
- :func:`check_algorithm` — ``needs`` is an :class:`~rlcore.interfaces.AlgorithmNeeds`;
  advantages finite, (B, R), zero outside the mask, row-order
  free; losses are scalars with gradient, documented metric names, and split-invariant
  (micro-batch losses sum to the mini-batch loss and gradient, rtol 1e-6 in float64).
- :func:`check_step_program` — the algorithm's step program (``step_program()``, None: the
  default) updates the actor once a step (``step-updates-actor``), trains on
  ``batch_size × n`` rows, ``n`` per prompt (``step-keeps-rows``), and resumed from a step's
  saved state trains on what the uninterrupted run does (``step-resumable``).
- :func:`check_engine` — an actor engine on a tiny model in a 1-rank gloo group: log-probs
  equal transformers', a step trains, synced weights load into transformers, checkpoints
  restore exactly.
- :func:`check_rollout` — ``traits(config)`` is a :class:`~rlcore.interfaces.RolloutTraits`;
  ``generate`` layout, masks, positions, greedy determinism,
  resumable sampling, ``update_weights``.
- :func:`check_consistency` — a rollout and an engine on the same weights give the same
  next-token distributions over the vocabulary at every response position (KL both ways,
  total variation, top-k overlap; :func:`measure_consistency` returns the table), and where
  they drift, the first decoder layer whose hidden states part; both sides through their
  optional ``next_token_distributions``.
- :func:`check_harness` — an ``[agent] harness`` through the real endpoint over the
  author's rollout: every run returns and calls, each row is the recorded tokens with the
  loss mask exactly on the model's, no split and no re-tokenisation mismatch (unless
  allowed); returns a :class:`HarnessReport`. :func:`check_rollout_endpoint` — a rollout
  serves the OpenAI endpoint: template prompt ids, completions that decode to the answer,
  one log-prob per token, token-id prompts used as given.
- :func:`check_environment` — ``reset`` returns ``(str, dict)``, ``step`` returns
  ``(str, finite reward, bool, bool, dict)`` and does not raise on adversarial action text,
  in time; optional author cases (task, actions, expected total reward).
- :func:`check_tool` — ``schema()`` well-formed, ``call`` returns text or raises
  ``ToolError`` (only) on adversarial arguments, in time; the tool pickles.

The ``Config`` rules, common to all: an attrs class, frozen, keyword-only, whose defaults
structure from an empty table through rlcore's config converter and validate, which refuses
an unknown key, and whose instances pickle. Required keys (``key(help=...)``, no default) are
allowed: the empty table must report exactly them missing, and the ``check_<kind>`` call then
takes ``config=`` (an instance with them set). A validator may raise ``ValueError``,
``TypeError`` or :class:`~rlcore.errors.ConfigError`; the run's error names the file and key
path before its text either way.
"""

from __future__ import annotations

from rlcore.testing.conformance._agent import HarnessReport, check_harness, check_rollout_endpoint
from rlcore.testing.conformance._algorithm import (
    POLICY_METRICS,
    check_algorithm,
    random_algorithm_batch,
)
from rlcore.testing.conformance._batch_reward import check_batch_reward, make_reward_batch
from rlcore.testing.conformance._common import check_config
from rlcore.testing.conformance._consistency import (
    CONSISTENCY_METRICS,
    ConsistencyReport,
    check_consistency,
    compare_distributions,
    measure_consistency,
)
from rlcore.testing.conformance._contract import check_contract, check_signatures
from rlcore.testing.conformance._engine import check_engine, random_engine_batch
from rlcore.testing.conformance._environment import ADVERSARIAL_ACTIONS, check_environment
from rlcore.testing.conformance._plugin import HEAVY_MODULES, check_plugin_module
from rlcore.testing.conformance._reward import ADVERSARIAL_INPUTS, check_reward
from rlcore.testing.conformance._rollout import check_rollout
from rlcore.testing.conformance._step import STEP_RULES, check_step_program
from rlcore.testing.conformance._tool import ADVERSARIAL_ARGUMENTS, check_tool

__all__ = [
    "ADVERSARIAL_ACTIONS",
    "ADVERSARIAL_ARGUMENTS",
    "ADVERSARIAL_INPUTS",
    "CONSISTENCY_METRICS",
    "HEAVY_MODULES",
    "POLICY_METRICS",
    "STEP_RULES",
    "ConsistencyReport",
    "HarnessReport",
    "check_algorithm",
    "check_batch_reward",
    "check_config",
    "check_consistency",
    "check_contract",
    "check_engine",
    "check_environment",
    "check_harness",
    "check_plugin_module",
    "check_reward",
    "check_rollout",
    "check_rollout_endpoint",
    "check_signatures",
    "check_step_program",
    "check_tool",
    "compare_distributions",
    "make_reward_batch",
    "measure_consistency",
    "random_algorithm_batch",
    "random_engine_batch",
]
