"""An engine against contract 1: ``forward_backward`` has no ``temperature`` argument.

Under contract 2 the worker calls ``forward_backward(batch, loss_fn, temperature=...,
with_entropy=...)``, which raised ``TypeError`` deep inside a running job before contracts
were versioned. Discovery refuses the distribution (no ``contract_version``) and names the
method to change, so nothing here runs as written. The bodies delegate to the FSDP2 engine, so
that the copy a test migrates by the note (core/README.md, Contract versions) trains.
"""

from __future__ import annotations

from rlcore_fsdp2.engine import FSDP2Engine


class OldEngine(FSDP2Engine):
    def forward_backward(self, batch, loss_fn, *, with_entropy=False):
        temperature = 1.0  # contract 1: the engine never saw the rollout's temperature
        return super().forward_backward(
            batch, loss_fn, temperature=temperature, with_entropy=with_entropy
        )

    def optimizer_step(self, *, lr):
        return super().optimizer_step(lr=lr)

    def compute_log_prob(self, batch, *, temperature, with_entropy=False):
        return super().compute_log_prob(batch, temperature=temperature, with_entropy=with_entropy)
