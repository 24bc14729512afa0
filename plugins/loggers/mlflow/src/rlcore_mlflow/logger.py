"""A run's metrics, hyper-parameters and plots in MLflow, through its tracking client.

    [trainer]
    loggers = ["console", "jsonl", "mlflow"]

    [trainer.logger_options.mlflow]
    tracking_uri = "http://127.0.0.1:5000"   # unset: MLFLOW_TRACKING_URI, else a local store

Without a tracking URI (option or ``MLFLOW_TRACKING_URI``), the run goes to a SQLite store in
the run directory, ``sqlite:///<run_dir>/mlflow.db``, with artifacts in
``<run_dir>/mlflow-artifacts`` (``mlflow ui --backend-store-uri sqlite:///...`` shows it).
The MLflow run id is kept in ``<run_dir>/mlflow_run_id``, so a resumed rlcore run continues
the same MLflow run. Hyper-parameters are the resolved config, one dotted key per value
(``actor.optim.lr``); metric names keep rlcore's (``critic/score/mean``), with characters
MLflow refuses replaced by ``_``.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
from mlflow.entities import Metric, Param, RunStatus
from mlflow.tracking import MlflowClient

from rlcore.interfaces import BaseLogger, RunInfo, key
from rlcore.tracking.bounds import check_folder, check_server, env_or_option

RUN_ID_FILE = "mlflow_run_id"
URI_KEY = "trainer.logger_options.mlflow.tracking_uri"
# MLflow's own limits: 1,000 metrics and 100 params per batch, 6,000 characters per value.
_METRICS_PER_BATCH = 1000
_PARAMS_PER_BATCH = 100
_PARAM_VALUE_CHARS = 6000
_REFUSED = re.compile(r"[^\w\-. :/]")


def metric_key(name: str) -> str:
    """``name`` as MLflow accepts it: letters, digits, ``_ - . : /`` and spaces."""
    return _REFUSED.sub("_", name)


def flat_params(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """Dotted keys for a nested config: ``{"actor": {"optim": {"lr": 1e-6}}}`` ->
    ``("actor.optim.lr", "1e-06")``."""
    for part, value in config.items():
        name = f"{prefix}{part}"
        if isinstance(value, Mapping) and value:
            yield from flat_params(value, f"{name}.")
        else:
            yield name, str(value)[:_PARAM_VALUE_CHARS]


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class MlflowLogger(BaseLogger):
    @attrs.frozen(kw_only=True)
    class Config(BaseLogger.Config):
        tracking_uri: str | None = key(
            None,
            "MLflow tracking URI; unset: MLFLOW_TRACKING_URI, else a SQLite store "
            "in the run directory.",
        )  # None: MLFLOW_TRACKING_URI, else a run-dir SQLite
        experiment: str | None = key(
            None, "MLflow experiment; unset: trainer.experiment_name."
        )  # None: [trainer] experiment_name
        run_name: str | None = key(
            None, "MLflow run name; unset: trainer.experiment_name."
        )  # None: [trainer] experiment_name

    config: MlflowLogger.Config

    @classmethod
    def check(cls, run: RunInfo, config: Any, timeout_s: float) -> None:
        """A tracking server answers within ``timeout_s``; a local store's folder is writable
        (the client alone retries a closed port with back-off for minutes)."""
        uri, where = env_or_option(config.tracking_uri, "MLFLOW_TRACKING_URI", URI_KEY)
        if not uri:
            check_folder(run.run_dir, "trainer.run_dir")
            return
        parts = urlsplit(uri)
        if parts.scheme in ("http", "https"):
            fix = f"start the tracking server, fix {where} or drop mlflow from trainer.loggers"
            check_server(uri, where, timeout_s, fix=fix)
        elif parts.scheme in ("", "file"):
            check_folder(Path(parts.path if parts.scheme else uri), where)
        elif parts.scheme == "sqlite" and parts.path not in ("", "/:memory:"):
            check_folder(Path(parts.path.removeprefix("/")).parent, where)

    def __init__(self, run: RunInfo, config: MlflowLogger.Config | None = None) -> None:
        super().__init__(run, config)
        uri = self.config.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        artifacts: str | None = None
        if not uri:  # a local store beside the run, never a server nobody started
            uri = f"sqlite:///{(run.run_dir / 'mlflow.db').resolve()}"
            artifacts = (run.run_dir / "mlflow-artifacts").resolve().as_uri()
        self.tracking_uri = uri
        self._client = MlflowClient(tracking_uri=uri)
        id_file = run.run_dir / RUN_ID_FILE
        if run.resuming and id_file.is_file():
            self.run_id = id_file.read_text().strip()
            self._client.update_run(self.run_id, status=RunStatus.to_string(RunStatus.RUNNING))
            return
        name = self.config.experiment or run.experiment_name
        found = self._client.get_experiment_by_name(name)
        experiment_id = (
            found.experiment_id
            if found is not None
            else self._client.create_experiment(name, artifact_location=artifacts)
        )
        created = self._client.create_run(
            experiment_id, run_name=self.config.run_name or run.experiment_name
        )
        self.run_id = created.info.run_id
        id_file.write_text(self.run_id + "\n")
        params = [Param(k, v) for k, v in flat_params(run.config)]
        for chunk in _chunks(params, _PARAMS_PER_BATCH):
            self._client.log_batch(self.run_id, params=chunk)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        now = int(time.time() * 1000)
        rows = [
            Metric(metric_key(key), float(value), now, step)
            for key, value in self.numbers(metrics).items()
        ]
        for chunk in _chunks(rows, _METRICS_PER_BATCH):
            self._client.log_batch(self.run_id, metrics=chunk)

    def log_files(self, paths: Sequence[Path]) -> None:
        for path in paths:
            self._client.log_artifact(self.run_id, str(path), artifact_path="plots")

    def close(self) -> None:
        self._client.set_terminated(self.run_id, status="FINISHED")
