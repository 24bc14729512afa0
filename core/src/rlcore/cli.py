"""The ``rlcore`` command: a dispatcher over subcommands that live in their own modules.

Any :class:`~rlcore.errors.RlcoreError` becomes ``error: <message>`` on stderr and exit code
2, without a traceback unless ``--debug``; anything else is a bug and keeps its traceback.
Commands written elsewhere (``plot``, ``export``) are listed only when their module is
installed and are imported only when run, so ``rlcore --help`` stays fast.

Where a key's value comes from, lowest to highest precedence: its default, the TOML file, an
environment variable of :data:`ENV_KEYS` (e.g. ``RLCORE_CALL_TIMEOUT_S=60`` sets
``resources.call_timeout_s``), a ``KEY=VALUE`` on the command line. This table is the only
place rlcore reads an ``RLCORE_*`` variable; each becomes an ordinary override, parsed and
checked like one (``rlcore config show`` prints the result).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, TextIO

from rlcore import __version__
from rlcore.errors import RlcoreError

if TYPE_CHECKING:
    from rlcore.config import RunConfig
    from rlcore.plugins import PluginRegistry

log = logging.getLogger(__name__)

__all__ = ["ENV_KEYS", "env_overrides", "main"]

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C

# name -> (module with `main(argv: list[str]) -> int`, one-line help)
_EXTERNAL: dict[str, tuple[str, str]] = {
    "plot": ("rlcore.tracking.plotting", "plot the metrics of a run directory"),
    "export": ("rlcore.checkpoint.export", "export a checkpoint (e.g. to a Hugging Face folder)"),
}


# Environment variable -> the config key it sets. Where two name one key, the first one set
# wins (RLCORE_NUM_THREADS over OMP_NUM_THREADS, as before).
ENV_KEYS: Final[dict[str, str]] = {
    "RLCORE_CALL_TIMEOUT_S": "resources.call_timeout_s",
    "RLCORE_START_TIMEOUT_S": "resources.start_timeout_s",
    "RLCORE_PLACEMENT_TIMEOUT_S": "resources.placement_timeout_s",
    "RLCORE_COLLECTIVE_TIMEOUT_S": "resources.collective_timeout_s",
    "RLCORE_HEARTBEAT_TIMEOUT_S": "resources.heartbeat_timeout_s",
    "RLCORE_NUM_THREADS": "resources.driver_num_threads",
    "OMP_NUM_THREADS": "resources.driver_num_threads",
    "RLCORE_MAX_GRAD_NORM": "trainer.grad_norm_ceiling",
    "RLCORE_AUTO_PADDING": "trainer.auto_padding",
    "RLCORE_DISABLE_PLUGINS": "plugins.disabled",
}
# Keys whose variable is not a TOML value: a switch (1/true/yes, 0/false/no) and a
# comma-separated list of names.
_FLAG_KEYS: Final = frozenset({"trainer.auto_padding"})
_LIST_KEYS: Final = frozenset({"plugins.disabled"})


def env_overrides(environ: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """``(variable, "key=value")`` for every variable of :data:`ENV_KEYS` that is set (blank
    counts as unset); the loader parses and checks each as a command-line override."""
    env = os.environ if environ is None else environ
    out: list[tuple[str, str]] = []
    keys: set[str] = set()
    for name, key in ENV_KEYS.items():
        raw = env.get(name, "").strip()
        if not raw or key in keys:
            continue
        keys.add(key)
        if key in _LIST_KEYS:
            value = json.dumps([n.strip() for n in raw.split(",") if n.strip()])
        elif key in _FLAG_KEYS and raw.lower() in ("1", "true", "yes", "0", "false", "no"):
            value = "true" if raw.lower() in ("1", "true", "yes") else "false"
        else:
            value = raw  # a number, or a word the key's check reports
        out.append((name, f"{key}={value}"))
    return out


def _load_config(args: argparse.Namespace) -> RunConfig:
    """The config file with the environment's and the command line's overrides, in that
    order; an error caused by a variable says which one set it."""
    from rlcore.config import ConfigValidationError, load_config

    from_env = env_overrides()
    try:
        return load_config(args.config, [o for _, o in from_env] + args.overrides, args.registry)
    except ConfigValidationError as err:
        given = {o.partition("=")[0].strip() for o in args.overrides}
        lines = []
        for line in err.errors:
            for name, override in from_env:
                key = override.partition("=")[0]
                if key not in given and line.startswith((f"{key}:", f"override '{key}=")):
                    line = f"{line} (set by {name}={os.environ.get(name, '').strip()!r})"
                    break
            lines.append(line)
        raise ConfigValidationError(err.source, lines) from None


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


# --- commands -------------------------------------------------------------------------------


def _cmd_plugins(args: argparse.Namespace) -> int:
    from rlcore.config import apply_overrides
    from rlcore.plugins import default_registry

    # The table shows every problem; the same lines as log warnings would only repeat it.
    logging.getLogger("rlcore.plugins").setLevel(logging.ERROR)
    raw: dict[str, Any] = {}
    apply_overrides(raw, [o for _, o in env_overrides() if o.startswith("plugins.disabled=")])
    registry = args.registry or default_registry(raw.get("plugins", {}).get("disabled", ()))
    rows = [("KIND", "NAME", "DISTRIBUTION", "VERSION", "STATUS")]
    for e in registry.entries():
        # Each target resolved (module found, class present) without importing backends.
        status = "duplicate" if registry.is_duplicate(e.kind, e.name) else registry.check(e)
        rows.append((e.kind, e.name, e.distribution or "-", e.version or "-", status))
    # A refused plugin's names, each with why (its contract version against this rlcore's).
    listed = set()
    for e, refusal in registry.refused_entries():
        status = f"refused: {refusal}{registry.refused_also(e)}"
        rows.append((e.kind, e.name, e.distribution or "-", e.version or "-", status))
        listed.add((e.distribution, e.plugin))
    for p in registry.problems:
        if p.status == "duplicate" or (p.distribution, p.plugin) in listed:
            continue  # already marked on the entries
        rows.append(("-", p.plugin, p.distribution or "-", p.version or "-", p.reason))
    _print_table(rows, sys.stdout)
    return 0


def _print_table(rows: Sequence[tuple[str, ...]], out: TextIO) -> None:
    # The last column (status) is left unpadded: it may be a long error message.
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [c.ljust(w) for c, w in zip(row, widths)] + [row[-1]]
        print("  ".join(cells).rstrip(), file=out)


def _cmd_validate(args: argparse.Namespace) -> int:
    _load_config(args)
    print(f"ok: {args.config} is valid")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    from rlcore.config import config_to_dict, dump_toml, unset_keys

    config = _load_config(args)
    sys.stdout.write(dump_toml(config_to_dict(config)))
    unset = unset_keys(config)
    if unset:  # TOML has no null: name the keys left unset, so every key is shown
        sys.stdout.write("\n# unset (no value): " + ", ".join(unset) + "\n")
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    from rlcore.config.reference import explain

    sys.stdout.write(explain(args.key, config=args.config, registry=args.registry))
    return 0


def _cmd_reference(args: argparse.Namespace) -> int:
    from rlcore.config.reference import render_markdown
    from rlcore.plugins import default_registry

    sys.stdout.write(render_markdown(args.registry or default_registry()))
    return 0


def _cmd_from_verl(args: argparse.Namespace) -> int:
    from rlcore.config.from_verl import convert_file, write_output

    result = convert_file(args.yaml, args.overrides)
    if args.output:
        write_output(result.toml, args.output, source=args.yaml)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(result.toml)
    for line in result.report_lines():
        print(line, file=sys.stderr)
    return 0


def _cmd_new_plugin(args: argparse.Namespace) -> int:
    from rlcore.testing.scaffold import write_plugin

    files = write_plugin(args.kind, args.name, args.dir)
    root = files[0].parent
    for path in files:
        print(f"wrote {path}")
    print(f"next: pip install -e {root} && rlcore plugins && pytest {root}")
    return 0


def _cmd_check_consistency(args: argparse.Namespace) -> int:
    from rlcore.testing.consistency_check import run_consistency_check

    return run_consistency_check(
        _load_config(args),
        prompts=args.prompts,
        kl_bound=args.kl_bound,
        layer_bound=args.layer_bound,
        top_k=args.top_k,
        registry=args.registry,
    )


def _cmd_train(args: argparse.Namespace) -> int:
    # Validates every section and resolves every selected plugin (engine, rollout, rewards,
    # algorithm): a missing plugin is reported with how to install it before Ray starts.
    config = _load_config(args)
    from rlcore.preflight import preflight
    from rlcore.preflight.hub import resolve_hub_names

    config = resolve_hub_names(config)  # Hub names -> local cache folders, or one line

    # Model, tokenizer, data files and the resume path are checked before Ray starts, so a bad
    # input costs a second and one clear line, not a worker traceback minutes later.
    prepared = preflight(config, registry=args.registry)
    from rlcore.trainer.plugin_checks import check_plugins

    check_plugins(config, args.registry)  # each engine's and the rollout's own (preflight)
    from rlcore.trainer import run_training
    from rlcore.trainer.runlock import acquire_run_lock
    from rlcore.workers.cluster import start_ray, stop_ray
    from rlcore.workers.termination import (
        children_shielded_from_sigterm,
        exit_code,
        exit_origin,
        sigterm_as_interrupt,
    )

    lock = acquire_run_lock(config.trainer.run_dir)  # a second train on it fails in one line
    started = False
    try:
        # SIGTERM (Slurm, Kubernetes) is handled like Ctrl-C; sent to the whole process group,
        # it reaches only this process: Ray and the reward pool start with it blocked.
        with sigterm_as_interrupt(), children_shielded_from_sigterm():
            started = _start_ray(start_ray, config)
            if started:  # a private Ray's processes end with this one, even on SIGKILL
                from rlcore.workers.reaper import start_reaper

                start_reaper()
            with sigterm_as_interrupt():  # again: ray.init installed its own handler
                result = run_training(config, prepared, registry=args.registry)
    except KeyboardInterrupt:
        # The trainer saves the last completed step on its way out; say where to pick up.
        print(_interrupted_line(config), file=sys.stderr)
        return exit_code(EXIT_INTERRUPTED)
    except SystemExit as exc:  # e.g. a reward function calling sys.exit: name it, keep going
        status = _interrupted_line(config).removeprefix("interrupted: ")
        msg = f"training stopped: SystemExit({exc.code!r}) raised in {exit_origin(exc)}; {status}"
        raise RlcoreError(msg) from exc
    finally:
        # A private Ray is stopped here, with its worker processes: nothing outlives the
        # command, whether it ends normally, on an error or on Ctrl-C.
        if started:
            stop_ray()
        lock.release()
    return result if isinstance(result, int) else 0


def _cmd_scale(args: argparse.Namespace) -> int:
    """Ask a running (or resumed) asynchronous run for N rollout replicas (a control file)."""
    from pathlib import Path

    from rlcore.trainer.elastic import SCALE_FILE, parse_scale, request_scale

    count = parse_scale(args.assignment)
    request = request_scale(Path(args.run_dir), count)
    print(
        f"asked for {request.rollout} rollout replica(s) ({Path(args.run_dir) / SCALE_FILE}); "
        "the run applies it between steps (fault/rollout_replicas)"
    )
    return 0


def _start_ray(start: Callable[[Any], bool], config: RunConfig) -> bool:
    """``start(config.resources)``; Ray's own start-up failure (e.g. "The current node timed out
    during startup" on an overloaded machine) becomes one line instead of its traceback."""
    try:
        return start(config.resources)
    except (RlcoreError, KeyboardInterrupt):
        raise
    except Exception as err:
        first = str(err).strip().splitlines()[0].rstrip(".") if str(err).strip() else ""
        msg = (
            f"Ray did not start: {type(err).__name__}: {first}; nothing was trained. Free CPU or "
            "memory and rerun; Ray's logs are under /tmp/ray/session_latest/logs"
        )
        raise RlcoreError(msg) from err


def _interrupted_line(config: RunConfig) -> str:
    from pathlib import Path

    from rlcore.checkpoint import CHECKPOINTS_DIR, CheckpointManager, step_of

    run_dir = config.trainer.run_dir
    latest = CheckpointManager(Path(run_dir) / CHECKPOINTS_DIR).latest() if run_dir else None
    if latest is None:
        return "interrupted: no checkpoint saved yet; a new run starts from step 0"
    return (
        f"interrupted: last checkpoint is step {step_of(latest)} ({latest}); "
        'rerun the same command to resume (trainer.resume = "auto")'
    )


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlcore", description="RL post-training for LLMs (verl's HybridFlow design)."
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks, log at DEBUG")
    parser.add_argument("--version", action="version", version=f"rlcore {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_config(p: argparse.ArgumentParser) -> None:
        p.add_argument("config", metavar="CONFIG", help="run configuration (TOML)")
        p.add_argument(
            "overrides",
            nargs="*",
            metavar="KEY=VALUE",
            help="override a key, value parsed as TOML (actor.optim.lr=1e-5)",
        )

    train = sub.add_parser("train", help="train with a TOML config")
    with_config(train)
    train.set_defaults(func=_cmd_train)

    scale = sub.add_parser(
        "scale", help="add or drain rollout replicas of a running asynchronous run"
    )
    scale.add_argument("run_dir", metavar="RUN_DIR", help="the run's trainer.run_dir")
    scale.add_argument("assignment", metavar="rollout=N", help="rollout replicas wanted (N >= 1)")
    scale.set_defaults(func=_cmd_scale)

    plugins = sub.add_parser("plugins", help="list installed plugins and their status")
    plugins.set_defaults(func=_cmd_plugins)

    new_plugin = sub.add_parser(
        "new-plugin", help="write a plugin package skeleton that passes its conformance check"
    )
    new_plugin.add_argument(
        "kind",
        metavar="KIND",
        choices=("engine", "rollout", "reward", "algorithm", "tool", "harness", "environment"),
    )
    new_plugin.add_argument("name", metavar="NAME", help="plugin and package name, e.g. my_reward")
    new_plugin.add_argument("--dir", default=".", help="where the NAME folder is written")
    new_plugin.set_defaults(func=_cmd_new_plugin)

    config = sub.add_parser("config", help="validate or show a configuration")
    config_sub = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    validate = config_sub.add_parser("validate", help="check a config, report every error")
    with_config(validate)
    validate.set_defaults(func=_cmd_validate)
    show = config_sub.add_parser("show", help="print the fully resolved config (defaults too)")
    with_config(show)
    show.set_defaults(func=_cmd_show)
    explain = config_sub.add_parser(
        "explain", help="type, default, allowed values and effect of one key"
    )
    explain.add_argument("key", metavar="KEY", help="a dotted key, e.g. actor.optim.lr")
    explain.add_argument(
        "--config", metavar="FILE", help="read which plugins are selected from this config"
    )
    explain.set_defaults(func=_cmd_explain)
    reference = config_sub.add_parser(
        "reference", help="every key as Markdown (docs/config.md), installed plugins included"
    )
    reference.set_defaults(func=_cmd_reference)
    from_verl = config_sub.add_parser(
        "from-verl",
        help="convert a verl (Hydra) YAML config and overrides to rlcore TOML",
        description="Convert verl's flattened config (_generated_ppo_trainer.yaml, or "
        "main_ppo --cfg job output) plus a launch script's Hydra overrides. Prints a note "
        "for each choice made and every verl key not mapped, with why. "
        "See docs/porting-from-verl.md.",
    )
    from_verl.add_argument("yaml", metavar="YAML", help="verl config, e.g. ppo_trainer.yaml")
    from_verl.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="verl overrides (data.train_batch_size=8)"
    )
    from_verl.add_argument("-o", "--output", metavar="OUT", help="write the TOML here")
    from_verl.set_defaults(func=_cmd_from_verl)

    check = sub.add_parser("check", help="check a configured run's components")
    check_sub = check.add_subparsers(dest="check_command", required=True, metavar="ACTION")
    consistency = check_sub.add_parser(
        "consistency",
        help="compare the rollout's next-token distributions with the actor engine's on the "
        "same weights (KL both ways, total variation, top-k overlap); exit 1 past the bound",
    )
    with_config(consistency)
    consistency.add_argument(
        "--prompts", type=int, default=8, help="prompts of data.train_files to sample (8)"
    )
    consistency.add_argument(
        "--kl-bound",
        type=float,
        default=1e-3,
        help="largest per-position KL, either direction, that passes (1e-3)",
    )
    consistency.add_argument(
        "--layer-bound",
        type=float,
        default=1e-2,
        help="relative hidden-state difference that marks a layer as drifted (1e-2)",
    )
    consistency.add_argument("--top-k", type=int, default=10, help="k of the top-k overlap (10)")
    consistency.set_defaults(func=_cmd_check_consistency)

    for name, (module, help_text) in _EXTERNAL.items():
        if _installed(module):
            # Parsed by the module itself (see main); listed here for --help only.
            sub.add_parser(name, help=help_text, add_help=False)
    return parser


def _configure_logging(debug: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )


def _external(argv: list[str]) -> tuple[Callable[[list[str]], int], list[str]] | None:
    """The ``main`` of an external command named by the first non-option argument."""
    index = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    if index is None or argv[index] not in _EXTERNAL:
        return None
    module_name, _ = _EXTERNAL[argv[index]]
    if not _installed(module_name):
        return None  # argparse reports an invalid choice
    func: Callable[[list[str]], int] = importlib.import_module(module_name).main
    return func, argv[index + 1 :]


def main(argv: Sequence[str] | None = None, *, registry: PluginRegistry | None = None) -> int:
    """Entry point of the ``rlcore`` console script; returns the exit code.

    ``registry`` replaces the installed plugins (tests); by default they are discovered.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        external = _external(argv)
        if external is not None:
            _configure_logging(debug)
            func, rest = external
            return int(func(rest) or 0)
        args = _build_parser().parse_args(argv)
        args.registry = registry
        _configure_logging(args.debug)
        return int(args.func(args) or 0)
    except RlcoreError as err:
        if debug:
            traceback.print_exc()
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
