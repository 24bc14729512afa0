"""Policy losses and advantage estimators by name, each kind with one signature (verl's API).

``[algorithm] policy_loss = "..."`` and ``[algorithm] adv_estimator = "..."`` select from
these registries. A name comes from one of two places:

- **a plugin distribution** (what a package does): the hooks ``register_policy_losses`` /
  ``register_adv_estimators`` map names to ``"module:function"`` strings, imported when a
  config selects them, in the driver and in every worker. The core's own losses and
  estimators are registered this way (:mod:`rlcore.builtin`), so ``rlcore plugins`` lists
  them and a duplicate name is reported with both distributions.
- **in-process** (verl's decorators, for a script or notebook)::

      from rlcore.rl.registry import register_policy_loss

      @register_policy_loss("my_loss")
      def my_loss(old_log_prob, log_prob, advantages, response_mask, *,
                  loss_agg_mode, config, totals=None, rollout_is_weights=None):
          ...

  Seen only by processes that import the module defining it: Ray workers do not run the
  driver's script, so a training run needs the plugin way (or the algorithm's own module
  to define the loss).

The signatures are :class:`PolicyLossFn` and :class:`AdvantageEstimatorFn`. An unknown name
raises a :class:`~rlcore.errors.PluginError` naming every registered name. This module imports
no torch (tensors appear in annotations only), so listing and validating names stays light.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from rlcore.errors import PluginError
from rlcore.plugins import PluginRegistry, current_registry

if TYPE_CHECKING:
    import numpy as np
    import torch

    from rlcore.interfaces import BatchTotals

__all__ = [
    "ADV_ESTIMATOR_KIND",
    "POLICY_LOSS_KIND",
    "AdvantageEstimatorFn",
    "PolicyLossFn",
    "adv_estimator_names",
    "get_adv_estimator_fn",
    "get_policy_loss_fn",
    "policy_loss_names",
    "register_adv_est",
    "register_policy_loss",
]

POLICY_LOSS_KIND: Final = "policy_loss"
ADV_ESTIMATOR_KIND: Final = "adv_estimator"


class PolicyLossFn(Protocol):
    """A policy loss on one micro-batch: ``(loss, metrics)``.

    - ``old_log_prob``, ``log_prob``, ``advantages``, ``response_mask``: (b, R); ``log_prob``
      carries the gradient. Padded positions may hold anything (NaN included): select with
      the mask, never multiply by it.
    - ``loss_agg_mode``: one of :data:`rlcore.rl.losses.LOSS_AGG_MODES`.
    - ``config``: the algorithm's ``Config`` (a
      :class:`rlcore.rl.algorithm.PolicyGradientAlgorithm.Config`); a loss reads its options
      there (``config.clip_ratio_low``, ...).
    - ``totals``: the mini-batch counts to normalise by (None: this micro-batch's own).
    - ``rollout_is_weights``: detached (b, R) truncated importance weights, or None.

    ``loss`` is a scalar with a graph; ``metrics`` are this micro-batch's own values
    (``actor/pg_loss``, ``actor/pg_clipfrac``, ``actor/pg_clipfrac_lower``, ``actor/ppo_kl``,
    and any of the loss's own). :func:`rlcore.rl.losses.policy_loss_fn` builds one from the
    per-token terms, with the shared aggregation and metrics. A loss whose every term is a
    multiple of the advantage may say so with :func:`rlcore.rl.losses.advantage_scaled`, so
    that zero-advantage rows can be left out of the backward pass.
    """

    def __call__(
        self,
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        *,
        loss_agg_mode: str,
        config: Any,
        totals: BatchTotals | None = None,
        rollout_is_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]: ...


class AdvantageEstimatorFn(Protocol):
    """An advantage estimator, on the driver: ``(advantages, returns)``, both (B, R).

    - ``token_level_rewards``, ``response_mask``: (B, R).
    - ``config``: the algorithm's ``Config``; an estimator reads its options there
      (``config.gamma``, ``config.epsilon``, ...).
    - ``index``: each row's prompt id (``non_tensor_batch["uid"]``, verl's ``index``), or
      None when the batch has none.
    - ``values``: the critic's (B, R) values, or None without a critic.

    Both results are zero outside ``response_mask``. An estimator that needs ``index`` or
    ``values`` and gets None raises a ``KeyError`` saying so.
    """

    def __call__(
        self,
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        *,
        config: Any,
        index: np.ndarray | None = None,
        values: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


_F = TypeVar("_F", bound=Callable[..., Any])

# In-process registrations (the decorators); plugin names live in the PluginRegistry.
_IN_PROCESS: Final[dict[str, dict[str, Callable[..., Any]]]] = {
    POLICY_LOSS_KIND: {},
    ADV_ESTIMATOR_KIND: {},
}
_LABEL: Final = {POLICY_LOSS_KIND: "policy loss", ADV_ESTIMATOR_KIND: "advantage estimator"}


def _register(kind: str, name: str) -> Callable[[_F], _F]:
    if not isinstance(name, str) or not name:
        msg = f"a {_LABEL[kind]} is registered under a non-empty string name, got {name!r}"
        raise PluginError(msg)

    def decorator(fn: _F) -> _F:
        found = _IN_PROCESS[kind].get(name)
        # Re-running a module (a notebook cell, importlib.reload) re-registers the same
        # function under its qualified name: allowed; a different function is a clash.
        if found is not None and _qualname(found) != _qualname(fn):
            msg = (
                f"{_LABEL[kind]} {name!r} is already registered by {_qualname(found)}; "
                f"{_qualname(fn)} needs another name"
            )
            raise PluginError(msg)
        _IN_PROCESS[kind][name] = fn
        return fn

    return decorator


def register_policy_loss(name: str) -> Callable[[_F], _F]:
    """Decorator: register a :class:`PolicyLossFn` in this process under ``name``."""
    return _register(POLICY_LOSS_KIND, name)


def register_adv_est(name: str) -> Callable[[_F], _F]:
    """Decorator: register an :class:`AdvantageEstimatorFn` in this process under ``name``."""
    return _register(ADV_ESTIMATOR_KIND, name)


def _qualname(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _names(kind: str, registry: PluginRegistry | None) -> list[str]:
    registry = registry if registry is not None else current_registry()
    return sorted(set(_IN_PROCESS[kind]) | set(registry.names(kind)))


def policy_loss_names(registry: PluginRegistry | None = None) -> list[str]:
    """Every registered policy loss (plugins, the core's included, and in-process), sorted."""
    return _names(POLICY_LOSS_KIND, registry)


def adv_estimator_names(registry: PluginRegistry | None = None) -> list[str]:
    """Every registered advantage estimator, sorted."""
    return _names(ADV_ESTIMATOR_KIND, registry)


def _get(kind: str, name: str, registry: PluginRegistry | None, where: str | None) -> Any:
    registry = registry if registry is not None else current_registry()
    local = _IN_PROCESS[kind].get(name)
    if name in registry.names(kind) or registry.is_duplicate(kind, name):
        found = registry.resolve_function(kind, name, where=where)
        if local is not None and local is not found:
            (entry,) = (e for e in registry.entries(kind) if e.name == name)
            msg = (
                f"{_LABEL[kind]} {name!r} is registered twice: in-process by "
                f"{_qualname(local)} and by {entry.provider} ({entry.target_name})"
            )
            raise PluginError(msg)
        return found
    if local is not None:
        return local
    at = f" in {where}" if where else ""
    known = ", ".join(_names(kind, registry)) or "none"
    msg = f"unknown {_LABEL[kind]} {name!r}{at}. Registered: {known}."
    raise PluginError(msg)


def get_policy_loss_fn(
    name: str, *, registry: PluginRegistry | None = None, where: str | None = None
) -> PolicyLossFn:
    """The policy loss registered as ``name`` (imports a plugin's module on first use).

    ``where`` names the config key for the error (``"[algorithm] policy_loss"``).
    """
    fn: PolicyLossFn = _get(POLICY_LOSS_KIND, name, registry, where)
    return fn


def get_adv_estimator_fn(
    name: str, *, registry: PluginRegistry | None = None, where: str | None = None
) -> AdvantageEstimatorFn:
    """The advantage estimator registered as ``name`` (imports a plugin's module on first use)."""
    fn: AdvantageEstimatorFn = _get(ADV_ESTIMATOR_KIND, name, registry, where)
    return fn
