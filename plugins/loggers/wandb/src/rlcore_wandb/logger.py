"""A run's metrics, hyper-parameters and plots in Weights & Biases, through its own client.

    [trainer]
    loggers = ["console", "jsonl", "wandb"]

    [trainer.logger_options.wandb]
    project = "gsm8k-grpo"
    mode = "offline"          # or "online"; unset: wandb decides (WANDB_MODE, login)

The wandb run lives in ``<run_dir>/wandb``; its id is kept in ``<run_dir>/wandb_run_id`` so a
resumed rlcore run continues the same wandb run (``resume="allow"``) instead of starting a
second one. An offline run is uploaded later with ``wandb sync <run_dir>/wandb/offline-run-*``.
Steps a resumed run repeats (those after its last checkpoint) are already in the wandb run;
wandb keeps the first values it saw for them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import wandb

from rlcore.interfaces import BaseLogger, RunInfo, key
from rlcore.tracking.bounds import check_folder, check_server, env_or_option

RUN_ID_FILE = "wandb_run_id"
MODE_KEY = "trainer.logger_options.wandb.mode"
DEFAULT_BASE_URL = "https://api.wandb.ai"


class WandbLogger(BaseLogger):
    @attrs.frozen(kw_only=True)
    class Config(BaseLogger.Config):
        project: str = key("rlcore", "W&B project.")
        entity: str | None = key(None, "W&B entity (user or team); unset: wandb's default.")
        name: str | None = key(
            None, "W&B run name; unset: trainer.experiment_name."
        )  # None: [trainer] experiment_name
        group: str | None = key(None, "W&B run group.")
        tags: tuple[str, ...] = key((), "W&B run tags.")
        mode: Literal["online", "offline", "disabled"] | None = key(
            None, "W&B mode; unset: wandb's own choice (WANDB_MODE, login state)."
        )  # None: wandb's choice

    config: WandbLogger.Config

    @classmethod
    def check(cls, run: RunInfo, config: Any, timeout_s: float) -> None:
        """The run's ``wandb`` folder is writable; online, the server answers in ``timeout_s``."""
        mode, where = env_or_option(config.mode, "WANDB_MODE", MODE_KEY)
        if mode == "disabled":
            return
        check_folder(run.run_dir / "wandb", "trainer.run_dir")
        if mode == "online":
            url, _ = env_or_option(None, "WANDB_BASE_URL", "WANDB_BASE_URL")
            fix = f'set {where} = "offline" (then wandb sync), or fix WANDB_BASE_URL'
            check_server(url or DEFAULT_BASE_URL, "WANDB_BASE_URL", timeout_s, fix=fix)

    def __init__(self, run: RunInfo, config: WandbLogger.Config | None = None) -> None:
        super().__init__(run, config)
        id_file = run.run_dir / RUN_ID_FILE
        run_id = id_file.read_text().strip() if run.resuming and id_file.is_file() else None
        self._run = wandb.init(
            project=self.config.project,
            entity=self.config.entity,
            name=self.config.name or run.experiment_name,
            group=self.config.group,
            tags=list(self.config.tags) or None,
            mode=self.config.mode,
            dir=str(run.run_dir),
            config=dict(run.config),
            id=run_id,
            resume="allow" if run_id else None,
            reinit="create_new",  # several rlcore runs in one process (tests, notebooks)
        )
        id_file.write_text(self._run.id + "\n")

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self._run.log(self.numbers(metrics), step=step)

    def log_files(self, paths: Sequence[Path]) -> None:
        images = {f"plots/{p.stem}": wandb.Image(str(p)) for p in paths if p.suffix == ".png"}
        if images:
            self._run.log(images)

    def close(self) -> None:
        self._run.finish()
