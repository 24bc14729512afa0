"""LoRA for the FSDP2 engine, through ``peft``: wrap, name, merge, and write adapters.

The engine holds a :class:`LoraAdapter`, which wraps the Hugging Face model with
:func:`peft.get_peft_model` *before* sharding, so ``fully_shard`` sees the frozen base weights
and the small ``lora_A``/``lora_B`` matrices as ordinary parameters of each decoder layer
(FSDP2 allows frozen and trainable parameters in one group; only the trainable ones get
gradients and optimizer state).

Names. Inside the engine a wrapped linear's weights are called (peft's layout)::

    base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight   # frozen W
    base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight
    base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight

:func:`hf_name` maps the first to the plain HF name (``model.layers.0.self_attn.q_proj.weight``)
that rollouts and ``save_pretrained`` folders use; :func:`peft_name` maps the adapter tensors to
the names of a peft adapter folder (``adapter_model.safetensors``: the adapter name removed).

Merging (what a rollout without LoRA support receives): ``W' = W + scaling * B @ A``, computed
in float32 on the full tensors the engine gathers anyway for weight sync, so no in-place merge
of sharded parameters is needed and the engine's own weights never change.

``peft`` is imported only when LoRA is on: it is an optional extra (``rlcore-fsdp2[lora]``).
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.distributed as dist

from rlcore.engine import copy_tokenizer_files, dtype_from_name
from rlcore.errors import ConfigError
from rlcore.interfaces import EngineSpec
from rlcore_fsdp2.weights import gathered

log = logging.getLogger(__name__)

__all__ = [
    "ADAPTER_NAME",
    "LoraAdapter",
    "LoraSettings",
    "apply_lora",
    "check_lora_targets",
    "hf_name",
    "is_adapter_name",
    "merge_stream",
    "peft_name",
]

ADAPTER_NAME = "default"  # peft's default adapter name; the engine trains exactly one
_PREFIX = "base_model.model."
_INSTALL = "pip install 'rlcore-fsdp2[lora]'  (or: pip install peft)"


@attrs.frozen(kw_only=True)
class LoraSettings:
    """The LoRA keys of the engine's ``Config`` (verl's names: ``lora_rank``, ``lora_alpha``)."""

    rank: int
    alpha: float
    dropout: float
    target_modules: str | tuple[str, ...]
    exclude_modules: tuple[str, ...] = ()

    def peft_config(self, *, base_model_path: str) -> Any:
        """The :class:`peft.LoraConfig` these settings describe."""
        LoraConfig = _peft().LoraConfig
        targets: str | list[str] = (
            self.target_modules
            if isinstance(self.target_modules, str)
            else list(self.target_modules)
        )
        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=targets,
            exclude_modules=list(self.exclude_modules) or None,
            bias="none",
            task_type="CAUSAL_LM",
            base_model_name_or_path=base_model_path,
        )


def _peft() -> Any:
    try:
        import peft
    except ImportError as err:
        msg = f"LoRA (lora_rank > 0 in the engine section) needs peft: {_INSTALL}"
        raise ConfigError(msg) from err
    return peft


def apply_lora(model: torch.nn.Module, settings: LoraSettings, *, where: str, **kw: Any) -> Any:
    """``model`` wrapped by :func:`peft.get_peft_model` (adapters trainable, the rest frozen).

    ``kw``: :meth:`LoraSettings.peft_config`'s arguments.

    A ``target_modules`` that matches nothing is a config error naming the key path.
    """
    peft = _peft()
    config = settings.peft_config(**kw)
    try:
        wrapped = peft.get_peft_model(model, config, adapter_name=ADAPTER_NAME)
    except ValueError as err:
        msg = f"{where}.target_modules = {settings.target_modules!r}: {err}"
        raise ConfigError(msg) from err
    return wrapped


def _shown(value: str | tuple[str, ...]) -> str:
    return json.dumps(value if isinstance(value, str) else list(value))


def check_lora_targets(spec: EngineSpec, settings: LoraSettings, *, where: str) -> None:
    """Before any worker starts: the adapter can be applied to ``spec``'s model, built on the
    meta device from its ``config.json`` (no weights read, no memory). One line naming
    ``<section>.target_modules`` (or ``lora_rank`` for a critic) otherwise."""
    key = where.strip("[]")
    if spec.value_head:
        msg = (
            f"{key}.lora_rank = {settings.rank}: LoRA for the critic (value head) is not "
            f"supported yet; set lora_rank = 0 in {where}"
        )
        raise ConfigError(msg)
    _peft()  # the install line first, when peft is missing
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        hf_config = AutoConfig.from_pretrained(
            spec.model_path, trust_remote_code=spec.trust_remote_code
        )
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(
                hf_config, trust_remote_code=spec.trust_remote_code
            )
    except (OSError, ValueError) as err:  # the worker's load reports it, with the model key
        log.debug("LoRA targets not checked before start: %s", err)
        return
    try:
        with warnings.catch_warnings():  # peft's and transformers' notes about a throwaway model
            warnings.simplefilter("ignore")
            apply_lora(model, settings, where=where, base_model_path=spec.model_path)
    except ConfigError:
        modules = model.named_modules()
        linear = sorted(
            {n.rsplit(".", 1)[-1] for n, m in modules if isinstance(m, torch.nn.Linear)}
        )
        msg = (
            f"{key}.target_modules = {_shown(settings.target_modules)} matches no module of "
            f"the model at {spec.model_path} ({type(model).__name__}); its linear layers are "
            f'{", ".join(linear)} (or use "all-linear")'
        )
        raise ConfigError(msg) from None


def is_adapter_name(name: str) -> bool:
    """Whether a parameter of the wrapped model belongs to the adapter (not the base)."""
    return ".lora_A." in name or ".lora_B." in name


def hf_name(name: str) -> str:
    """The plain HF name of a base weight of the wrapped model (see the module docstring)."""
    if name.startswith(_PREFIX):
        name = name[len(_PREFIX) :]
    return name.replace(".base_layer.", ".")


def peft_name(name: str) -> str:
    """The name of an adapter tensor in a peft adapter folder (the adapter name removed)."""
    return name.replace(f".{ADAPTER_NAME}.", ".")


def lora_scaling(model: torch.nn.Module) -> dict[str, float]:
    """``module path -> scaling`` (alpha / r) of every LoRA-wrapped layer, in HF naming."""
    scales: dict[str, float] = {}
    for path, module in model.named_modules():
        scaling = getattr(module, "scaling", None)
        if isinstance(scaling, dict) and ADAPTER_NAME in scaling and hasattr(module, "lora_A"):
            scales[hf_name(path + ".")[:-1]] = float(scaling[ADAPTER_NAME])
    return scales


def merge_stream(
    named: Iterable[tuple[str, torch.Tensor]],
    adapters: dict[str, torch.Tensor],
    scaling: dict[str, float],
    dtype: torch.dtype | None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Full base tensors of the wrapped model -> merged tensors in plain HF naming.

    ``named``: (wrapped-model name, full tensor) of every non-adapter tensor. ``adapters``:
    the full ``lora_A``/``lora_B`` tensors (wrapped-model names). For a wrapped linear the
    yielded weight is ``W + scaling * B @ A`` (in float32, then cast to ``dtype``, else to
    W's own dtype); other tensors pass unchanged.
    """
    for name, tensor in named:
        plain = hf_name(name)
        module = plain.rsplit(".", 1)[0]
        target = dtype or tensor.dtype
        if ".base_layer." in name and plain.endswith(".weight") and module in scaling:
            stem = name.split(".base_layer.")[0]
            a = adapters[f"{stem}.lora_A.{ADAPTER_NAME}.weight"].float()  # (r, in)
            b = adapters[f"{stem}.lora_B.{ADAPTER_NAME}.weight"].float()  # (out, r)
            tensor = tensor.float() + scaling[module] * (b @ a)  # (out, in)
        yield plain, tensor.to(target)


# --- the engine's LoRA (held by FSDP2Engine when ``lora_rank > 0``) ---------------------------


class LoraAdapter:
    """The LoRA adapters of one engine's model: wrap it, then sync, save and export them.

    The engine builds one from its settings, passes its model through :meth:`wrap` before
    sharding (the wrapped module is the one the engine shards and trains) and calls the rest
    on it. Collective methods (every rank calls them) gather through
    :func:`rlcore_fsdp2.weights.gathered` onto ``device``.
    """

    def __init__(self, settings: LoraSettings, spec: EngineSpec, device: torch.device) -> None:
        self.settings = settings
        self.spec = spec
        self.device = device
        self.model: torch.nn.Module | None = None  # the wrapped model, once wrap() ran

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` with LoRA adapters, before sharding; only adapters train."""
        spec, settings = self.spec, self.settings
        where = f"[{spec.role}.engine]"
        if spec.value_head:
            msg = (
                f"{where}.lora_rank = {settings.rank}: LoRA for the critic (value head) is not "
                "supported yet; set lora_rank = 0 in [critic.engine]"
            )
            raise ConfigError(msg)
        wrapped = apply_lora(model, settings, where=where, base_model_path=spec.model_path)
        if spec.gradient_checkpointing:
            # Frozen embeddings give checkpointed blocks inputs without grad: ask for them.
            wrapped.enable_input_require_grads()
        trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
        total = sum(p.numel() for p in wrapped.parameters())
        log.info(
            "[%s] LoRA rank %d: %d of %d parameters train (%.2f%%)",
            spec.role,
            settings.rank,
            trainable,
            total,
            100.0 * trainable / max(1, total),
        )
        self.model = wrapped
        return self.model

    def _wrapped(self) -> Any:
        if self.model is None:
            msg = "LoraAdapter.wrap(model) must run before the adapters are used"
            raise RuntimeError(msg)
        return self.model

    def disabled(self) -> AbstractContextManager[Any]:
        """The base model: adapters off inside the block (the reference under LoRA)."""
        context: AbstractContextManager[Any] = self._wrapped().disable_adapter()
        return context

    @staticmethod
    def adapter_state(model_state: dict[str, Any]) -> dict[str, Any]:
        """The adapter entries of a (sharded) model state dict: what a LoRA checkpoint holds."""
        return {k: v for k, v in model_state.items() if is_adapter_name(k)}

    def _full_adapters(self) -> dict[str, torch.Tensor]:
        """Every adapter tensor in full, float32, on CPU (small: collective on every rank)."""
        return {
            name: tensor.detach().to("cpu", torch.float32, copy=True)
            for name, tensor in gathered(
                self._wrapped(), is_adapter_name, torch.float32, self.device
            )
        }

    def merged_for_sync(self, dtype: torch.dtype | None) -> Iterator[tuple[str, torch.Tensor]]:
        """The merged model, streamed under plain HF names (see :func:`merge_stream`)."""
        model = self._wrapped()
        adapters = {name: t.to(self.device) for name, t in self._full_adapters().items()}
        base = gathered(model, lambda name: not is_adapter_name(name), None, self.device)
        yield from merge_stream(base, adapters, lora_scaling(model), dtype)

    def peft_config(self) -> dict[str, Any]:
        """The adapter's peft config as the dict ``adapter_config.json`` holds."""
        config: Any = self._wrapped().peft_config[ADAPTER_NAME]
        result: dict[str, Any] = config.to_dict()
        return result

    def for_sync(self) -> tuple[dict[str, Any], Iterator[tuple[str, torch.Tensor]]]:
        """(peft config dict, adapter tensors under peft folder names), for LoRA-aware rollouts."""
        adapters = self._full_adapters()
        return self.peft_config(), ((peft_name(n), t) for n, t in adapters.items())

    def export_adapter(self, path: str) -> None:
        """A peft adapter folder (``adapter_config.json``, ``adapter_model.safetensors``) and the
        tokenizer files: ``PeftModel.from_pretrained(base, path)`` loads it."""
        from safetensors.torch import save_file

        adapters = self._full_adapters()
        if dist.get_rank() == 0:
            out = Path(path)
            out.mkdir(parents=True, exist_ok=True)
            peft_config: Any = self._wrapped().peft_config[ADAPTER_NAME]
            peft_config.save_pretrained(str(out))
            dtype = dtype_from_name(self.spec.dtype)
            tensors = {peft_name(n): t.to(dtype).contiguous() for n, t in adapters.items()}
            save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
            copy_tokenizer_files(Path(self.spec.model_path), out)
        dist.barrier()

    def export_merged(self, path: str) -> None:
        """A plain transformers folder of the merged model (base config, ``W + scaling*B@A``)."""
        from transformers import AutoModelForCausalLM

        spec = self.spec
        dtype = dtype_from_name(spec.dtype)
        merged = {name: t.to("cpu", copy=True) for name, t in self.merged_for_sync(dtype)}
        if dist.get_rank() == 0:
            # The base model's own class and config write the folder (tied weights, generation
            # config); strict loading proves every merged name is a base-model name.
            model = AutoModelForCausalLM.from_pretrained(
                spec.model_path, dtype=dtype, trust_remote_code=spec.trust_remote_code
            )
            model.load_state_dict(merged, strict=True)
            out = Path(path)
            out.mkdir(parents=True, exist_ok=True)
            model.save_pretrained(out, safe_serialization=True)
            copy_tokenizer_files(Path(spec.model_path), out)
        dist.barrier()
