"""Generation roles: frozen models served by a rollout engine for a batched reward (a judge).

A :class:`~rlcore.interfaces.BaseBatchReward` declares them (:attr:`BaseBatchReward.roles`,
each a :class:`~rlcore.interfaces.GenerationRole`); the driver turns each into a
:class:`~rlcore.roles.specs.GenerationRoleSpec`
(:func:`rlcore.trainer.specs.build_generation_role_specs`), the builder places a
:class:`GenerationRoleWorker` beside the policy in every process of the run's pool, as it
places an algorithm's extra roles (:mod:`rlcore.roles.extra_roles`), and the reward manager
hands the worker groups to their scorer (:meth:`BaseBatchReward.bind_roles`).

The worker holds the rollout engine and the model's tokenizer: text in, text out
(:meth:`GenerationRoleWorker.generate_text`), so the driver never loads the judge's tokenizer
and the rows split over the ranks like a rollout's. Its weights are never synced (the
policy's weight sync reaches the policy's rollout only) and it keeps no training state: a
resumed run rebuilds it from its model folder.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from rlcore.dispatch import Dispatch, mesh_dispatch_mode, register
from rlcore.engine.rollout_layout import position_ids_from_mask
from rlcore.workers import RoleWorker

if TYPE_CHECKING:
    from rlcore.interfaces import BaseRollout, SamplingParams
    from rlcore.protocol import DataProto
    from rlcore.roles.specs import GenerationRoleSpec

log = logging.getLogger(__name__)

__all__ = [
    "GENERATED_TEXT_KEY",
    "GENERATION_MESH",
    "PROMPT_TEXT_KEY",
    "TRUNCATED_KEY",
    "GenerationRoleWorker",
]

PROMPT_TEXT_KEY = "prompt_text"
GENERATED_TEXT_KEY = "generated_text"
TRUNCATED_KEY = "prompt_truncated"
# One worker instance per role in a process: each declares its own place in this mesh.
GENERATION_MESH = "generation_role"
_GEN = mesh_dispatch_mode(GENERATION_MESH)


class GenerationRoleWorker(RoleWorker):
    """A frozen model's rollout: ``generate_text`` (see the module docstring)."""

    spec: GenerationRoleSpec

    def __init__(self, spec: GenerationRoleSpec) -> None:
        super().__init__(spec)
        self.rollout: BaseRollout | None = None
        self.tokenizer: Any = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        from transformers import AutoTokenizer

        from rlcore.roles.mesh import declare_mesh

        spec = self.spec
        self.init_process_group(spec.backend)
        self.tokenizer = AutoTokenizer.from_pretrained(
            spec.rollout_spec.model_path, trust_remote_code=spec.rollout_spec.trust_remote_code
        )
        if spec.apply_chat_template and not getattr(self.tokenizer, "chat_template", None):
            log.warning(
                "role %s: %s has no chat template; prompts are tokenized as plain text",
                spec.name,
                spec.rollout_spec.model_path,
            )
        # Ranks draw different samples (when sampling); reruns reproduce.
        rollout_spec = attrs.evolve(
            spec.rollout_spec, seed=spec.rollout_spec.seed + 1000 * self.rank + 7
        )
        self.rollout = spec.rollout.build(rollout_spec)
        declare_mesh(self, self.rollout, GENERATION_MESH)
        log.info("rank %d: role %s ready", self.rank, spec.name)

    def _encode(self, text: str) -> list[int]:
        tok = self.tokenizer
        if self.spec.apply_chat_template and getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
            if isinstance(ids, Mapping):  # newer transformers may return a BatchEncoding
                ids = ids["input_ids"]
            return [int(i) for i in ids]
        return [int(i) for i in tok(text, add_special_tokens=True)["input_ids"]]

    @register(dispatch_mode=_GEN, blocking=False)
    def generate_text(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        """``generated_text`` (and ``prompt_truncated``) for each row's ``prompt_text``.

        Non-blocking: the driver gets a future (``.refs``, ``.get()``), so that the caller
        bounds its wait with a limit of its own (a judge's ``timeout_s``)."""
        import numpy as np
        import torch

        from rlcore.protocol import DataProto
        from rlcore.roles.update import clock, summed

        if self.rollout is None or self.tokenizer is None:
            msg = f"GenerationRoleWorker {self.spec.name}: call init_model() first"
            raise RuntimeError(msg)
        texts = [str(t) for t in prompts.non_tensor_batch[PROMPT_TEXT_KEY]]
        limit = self.spec.rollout_spec.max_prompt_length
        encoded = [self._encode(t) for t in texts]
        truncated = [len(ids) > limit for ids in encoded]
        encoded = [ids[-limit:] if len(ids) > limit else ids for ids in encoded]
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = self.tokenizer.eos_token_id or 0
        width = max((len(ids) for ids in encoded), default=1) or 1
        input_ids = torch.full((len(encoded), width), int(pad), dtype=torch.long)
        attention = torch.zeros((len(encoded), width), dtype=torch.long)
        for i, ids in enumerate(encoded):  # left-padded, as every rollout expects
            if ids:
                input_ids[i, width - len(ids) :] = torch.as_tensor(ids, dtype=torch.long)
                attention[i, width - len(ids) :] = 1
        position_ids = position_ids_from_mask(attention)
        batch = DataProto.from_dict(
            tensors={
                "input_ids": input_ids,
                "attention_mask": attention,
                "position_ids": position_ids,
            }
        )
        max_new = min(sampling.max_new_tokens, self.spec.rollout_spec.max_response_length)
        timing: dict[str, list[float]] = {}
        with clock(timing, f"{self.spec.name}_generate"):
            self.rollout.wake_up()
            out = self.rollout.generate(batch, attrs.evolve(sampling, max_new_tokens=max_new))
        responses = out.batch["responses"]
        mask = out.batch["response_mask"].bool()
        answers = [
            self.tokenizer.decode(responses[i][mask[i]].tolist(), skip_special_tokens=True)
            for i in range(len(encoded))
        ]
        generated = np.empty(len(answers), dtype=object)
        generated[:] = answers
        metrics = summed(timing)
        metrics[f"{self.spec.name}/response_tokens"] = float(mask.sum())
        return DataProto.from_dict(
            non_tensors={
                GENERATED_TEXT_KEY: generated,
                TRUNCATED_KEY: np.array(truncated, dtype=bool),
            },
            meta_info={"metrics": metrics},
        )
