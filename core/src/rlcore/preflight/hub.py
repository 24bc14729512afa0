"""Hugging Face Hub names for models and data sets, resolved to local folders in one place.

``model.path = "org/name"`` (with ``model.revision``) and a data file entry
``"org/name[@revision][:split]"`` are looked up in the Hub cache first
(``snapshot_download(..., local_files_only=True)``: ``HF_HUB_CACHE``, else ``HF_HOME/hub``);
on a miss they are downloaded unless ``HF_HUB_OFFLINE=1`` (the normal case on a cluster: the
cache was filled beforehand). A name that is neither a local path nor in the cache is one
:class:`~rlcore.errors.ConfigError` line naming the key, the cache folder and
``HF_HUB_OFFLINE``, before Ray starts. Local paths are left exactly as they are, and nothing
here imports ``huggingface_hub`` unless a name needs it. A ``.gguf`` file or a ``dist:``
reference to one becomes its converted folder (:mod:`rlcore.preflight.gguf_file`).

A data set's split selects its parquet files: ``train`` matches ``train.parquet``,
``train-00000-of-00002.parquet`` and ``train/*.parquet`` anywhere in the snapshot;
``main/train`` only under a ``main`` folder (a subset). Without ``:split``, train files take
``train`` and validation files ``test``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from rlcore.errors import ConfigError

if TYPE_CHECKING:
    from rlcore.config import RunConfig

__all__ = ["hub_cache_dir", "is_hub_name", "resolve_dataset", "resolve_hub_names", "resolve_model"]

_REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
_DATA = re.compile(
    r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(@(?P<rev>[\w./-]+?))?(:(?P<split>[\w./-]+))?"
)
_FILE_SUFFIXES = (".parquet", ".jsonl", ".json")
_TRUE = {"1", "on", "yes", "true"}


def hub_cache_dir() -> Path:
    """Where the Hub cache is, read from the environment now (``HF_HUB_CACHE``, ``HF_HOME``)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface"
    )
    return Path(home).expanduser() / "hub"


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def is_hub_name(path: str) -> bool:
    """``org/name``, not an existing local path: what is looked up on the Hub."""
    return bool(_REPO.fullmatch(path)) and not Path(path).exists()


def _snapshot(repo: str, revision: str | None, repo_type: str, key: str) -> Path:
    from huggingface_hub import snapshot_download

    cache = hub_cache_dir()
    kind = "model" if repo_type == "model" else "data set"
    at = f"@{revision}" if revision else ""
    try:
        return Path(
            snapshot_download(
                repo, repo_type=repo_type, revision=revision, cache_dir=cache, local_files_only=True
            )
        )
    except Exception as err:  # LocalEntryNotFoundError and kin: not in the cache
        cached_error: Exception = err
    offline = _offline()
    if not offline:
        try:
            return Path(
                snapshot_download(repo, repo_type=repo_type, revision=revision, cache_dir=cache)
            )
        except Exception as err:  # unreachable Hub, unknown repo, gated: the line says which
            first = (str(err).splitlines() or [""])[0][:200]
            reason = f"download failed: {type(err).__name__}: {first}"
    else:
        reason = f"not in the cache ({type(cached_error).__name__})"
    flag = "" if repo_type == "model" else " --repo-type dataset"
    msg = (
        f"{key}: {repo!r}{at} is neither a local path nor a {kind} in the Hugging Face cache "
        f"{cache} (HF_HUB_OFFLINE={'1' if offline else 'unset'}; {reason}); download it "
        f"there first (huggingface-cli download {repo}{flag}), set HF_HOME/HF_HUB_CACHE to "
        "the cache that holds it, or give a local folder"
    )
    raise ConfigError(msg)


def resolve_model(path: str, revision: str | None, key: str) -> str:
    """The local folder of model ``path``: itself when local, the converted folder of a GGUF
    file (:mod:`rlcore.preflight.gguf_file`), else its Hub snapshot."""
    from rlcore.preflight.gguf_file import is_gguf_reference, resolve_gguf

    if is_gguf_reference(path):
        return resolve_gguf(path, key)
    if path.startswith("~"):  # a shell would have expanded it; transformers does not
        return str(Path(path).expanduser())
    if not is_hub_name(path):
        return path
    return str(_snapshot(path, revision, "model", key))


def _split_files(root: Path, split: str) -> list[Path]:
    *subset, name = [p for p in split.split("/") if p]
    found = []
    for file in sorted(root.rglob("*.parquet")):
        parts = file.relative_to(root).parts
        dirs, stem = parts[:-1], Path(parts[-1]).stem
        if not all(s in dirs for s in subset):
            continue
        if name in dirs or stem == name or re.match(rf"{re.escape(name)}[-_.]", stem):
            found.append(file)
    return found


def resolve_dataset(entry: str, key: str, default_split: str) -> list[str]:
    """The local files of one ``data.*_files`` entry: itself when local (or a file name), else
    the parquet files of the Hub data set's split."""
    if entry.startswith("~"):  # a local path under a home folder, never a Hub name
        return [str(Path(entry).expanduser())]
    match = _DATA.fullmatch(entry)
    if Path(entry).exists() or entry.lower().endswith(_FILE_SUFFIXES) or match is None:
        return [entry]
    split = match.group("split") or default_split
    root = _snapshot(match.group("repo"), match.group("rev"), "dataset", key)
    files = _split_files(root, split)
    if not files:
        have = sorted(str(p.relative_to(root)) for p in root.rglob("*.parquet"))[:6]
        msg = (
            f"{key}: data set {match.group('repo')!r} has no parquet files for split {split!r} "
            f"in {root} (found {have or 'none'}); name the split as 'org/name:split'"
        )
        raise ConfigError(msg)
    return [str(f) for f in files]


def resolve_hub_names(config: RunConfig) -> RunConfig:
    """``config`` with every Hub name and GGUF file (model, tokenizer, critic, extra roles,
    reward model, a judge's model_path; data files) replaced by its local folder; unchanged
    (the same object) when all paths are local."""
    model = config.model
    rev = model.revision

    def folder(path: str, key: str) -> str:
        return resolve_model(path, rev if path == model.path else None, key)

    changes: dict[str, Any] = {}
    new_model = attrs.evolve(
        model,
        path=folder(model.path, "model.path"),
        tokenizer_path=folder(model.tokenizer_path, "model.tokenizer_path"),
    )
    if new_model != model:
        changes["model"] = new_model
    critic_path = folder(config.critic.model_path, "critic.model_path")
    if critic_path != config.critic.model_path:
        changes["critic"] = attrs.evolve(config.critic, model_path=critic_path)
    roles = dict(config.roles)
    for name, role in roles.items():
        path = folder(role.model.path, f"roles.{name}.model.path") if role.model.path else ""
        if path != role.model.path:
            roles[name] = attrs.evolve(role, model=attrs.evolve(role.model, path=path))
    if roles != config.roles:
        changes["roles"] = roles
    rm = config.reward_model
    rm_path = folder(rm.model.path, "reward_model.model.path") if rm.model.path else ""
    if rm_path != rm.model.path:
        changes["reward_model"] = attrs.evolve(rm, model=attrs.evolve(rm.model, path=rm_path))
    options = dict(config.reward.options)
    for name, opts in options.items():  # a judge's model (GenerationRole.model_key's default)
        judge = getattr(opts, "model_path", None) if attrs.has(type(opts)) else None
        if isinstance(judge, str) and judge:
            path = folder(judge, f"reward.options.{name}.model_path")
            if path != judge:
                options[name] = attrs.evolve(opts, model_path=path)
    if options != config.reward.options:
        changes["reward"] = attrs.evolve(config.reward, options=options)
    data = config.data
    train = tuple(
        f for e in data.train_files for f in resolve_dataset(e, "data.train_files", "train")
    )
    val = tuple(f for e in data.val_files for f in resolve_dataset(e, "data.val_files", "test"))
    if (train, val) != (data.train_files, data.val_files):
        changes["data"] = attrs.evolve(data, train_files=train, val_files=val)
    return attrs.evolve(config, **changes) if changes else config
