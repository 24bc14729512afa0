"""Bad-input catalogue: a tracker whose destination cannot take the run is one line, exit 2,
before Ray starts (``rlcore train`` for real up to Ray, which must not be reached): an MLflow
server that is closed or never answers (the client alone retried with back-off and the run
still hung at 240 s, after the workers had started), a wandb folder that cannot be written."""

from __future__ import annotations

import time

import _bad_inputs as bi
import pytest

from rlcore.testing.servers import closed_port_url, silent_server

registry, tiny, run = bi.registry, bi.tiny, bi.run  # fixtures

BOUND_S = 2.0


@pytest.fixture
def no_ray(monkeypatch):
    import rlcore.workers.cluster

    def start_ray(resources):
        raise AssertionError("Ray was started: the tracker was not checked before it")

    monkeypatch.setattr(rlcore.workers.cluster, "start_ray", start_ray)


@pytest.mark.parametrize("server", ["closed", "silent"])
def test_an_mlflow_server_that_cannot_take_the_run(run, capsys, registry, no_ray, tmp_path, server):
    pytest.importorskip("rlcore_mlflow.logger")
    with silent_server() as silent:
        url = closed_port_url() if server == "closed" else silent
        start = time.monotonic()
        code, err = bi.cli(
            [
                "train",
                str(run),
                f'trainer.run_dir="{tmp_path / "r"}"',
                'trainer.loggers=["jsonl", "mlflow"]',
                f'trainer.logger_options.mlflow.tracking_uri="{url}"',
                f"trainer.logger_timeout_s={BOUND_S}",
            ],
            capsys,
            registry,
        )
        took = time.monotonic() - start
    print(f"{server} server: exit {code} after {took:.1f} s (preflight included)")
    cause = {
        "closed": "connection refused: nothing listens there",
        "silent": f"no answer within {BOUND_S:g} s (trainer.logger_timeout_s)",
    }[server]
    key = "trainer.logger_options.mlflow.tracking_uri"
    bi.assert_one_line(
        code,
        err,
        f"{key} = {url!r}: {cause}; start the tracking server, fix {key} or drop mlflow from "
        "trainer.loggers (checked before Ray starts)",
    )


def test_a_wandb_folder_that_cannot_be_written(run, capsys, registry, no_ray, tmp_path):
    pytest.importorskip("rlcore_wandb.logger")
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "wandb").write_text("a file where wandb keeps its run folder")
    code, err = bi.cli(
        [
            "train",
            str(run),
            f'trainer.run_dir="{run_dir}"',
            'trainer.loggers=["jsonl", "wandb"]',
            'trainer.logger_options.wandb.mode="offline"',
        ],
        capsys,
        registry,
    )
    bi.assert_one_line(
        code,
        err,
        f"trainer.run_dir: cannot write to {run_dir / 'wandb'} (File exists); make it "
        "writable or change trainer.run_dir",
    )
