"""A round-1 engine migrated by forward_backward's line of the note only.

It declares ``contract_version = 2`` and takes ``forward_backward(..., *, temperature)``, but
keeps round 1's ``optimizer_step()`` (the engine ran its own learning-rate schedule) and
``compute_log_prob(batch)`` without ``temperature``. Before signatures were checked it was
reported ``ok`` and failed 28.6 s into the run with ``TypeError: optimizer_step() got an
unexpected keyword argument 'lr'``; now resolving it is refused before Ray with both methods
named. The bodies delegate to the FSDP2 engine, so that the copy a test migrates trains.
"""

from __future__ import annotations

from rlcore_fsdp2.engine import FSDP2Engine


class NoteEngine(FSDP2Engine):
    def forward_backward(self, batch, loss_fn, *, temperature, with_entropy=False):
        return super().forward_backward(
            batch, loss_fn, temperature=temperature, with_entropy=with_entropy
        )

    def optimizer_step(self):
        lr = self.spec.optim.lr  # round 1: the engine's own (constant) schedule
        return super().optimizer_step(lr=lr)

    def compute_log_prob(self, batch, *, with_entropy=False):
        temperature = 1.0  # round 1: log-probs of the untempered distribution
        return super().compute_log_prob(batch, temperature=temperature, with_entropy=with_entropy)
