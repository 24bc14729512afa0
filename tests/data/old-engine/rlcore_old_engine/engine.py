"""An engine against contract 1: ``forward_backward`` has no ``temperature`` argument.

Under contract 2 the worker calls ``forward_backward(batch, loss_fn, temperature=...,
with_entropy=...)``, which raised ``TypeError`` deep inside a running job before contracts
were versioned. Discovery now refuses the distribution, so nothing here ever runs; the
bodies only say so.
"""

from __future__ import annotations

from rlcore.interfaces import BaseEngine

_NEVER = "rlcore-old-engine is a contract-1 test fixture; discovery refuses it"


class OldEngine(BaseEngine):
    def forward_backward(self, batch, loss_fn, *, with_entropy=False):
        raise NotImplementedError(_NEVER)

    def optimizer_step(self, *, lr):
        raise NotImplementedError(_NEVER)

    def compute_log_prob(self, batch, *, temperature, with_entropy=False):
        raise NotImplementedError(_NEVER)

    def named_parameters_for_sync(self):
        raise NotImplementedError(_NEVER)

    def save_checkpoint(self, path):
        raise NotImplementedError(_NEVER)

    def load_checkpoint(self, path):
        raise NotImplementedError(_NEVER)

    def export_hf(self, path):
        raise NotImplementedError(_NEVER)
