"""rlcore plot: PNG curves from metrics.jsonl."""

from __future__ import annotations

import json

import pytest

from rlcore.errors import DataError
from rlcore.tracking.plotting import load_metrics, main, plot_run

pytest.importorskip("matplotlib", reason="matplotlib is the optional rlcore[plot] dependency")


def write_run(run, rows):
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_plot_run_writes_a_png_per_panel(tmp_path):
    rows = [
        {
            "step": s,
            "critic/score/mean": s / 10,
            "actor/ppo_kl": 0.01 * s,
            "actor/entropy": 1.0 - s / 20,
            "response_length/mean": 20 + s,
            "timing_s/step": 2.5 + 0.1 * s,
        }
        for s in range(1, 6)
    ]
    rows += [{"step": 0, "val/arithmetic/acc": 0.3}, {"step": 5, "val/arithmetic/acc": 0.55}]
    run = write_run(tmp_path / "run", rows)
    paths = plot_run(run)
    assert paths[0].name == "summary.png"  # first: the one page the end of a run names
    names = sorted(p.name for p in paths[1:])
    assert names == [
        "entropy.png",
        "kl.png",
        "response_length.png",
        "reward.png",
        "step_time.png",
        "val_accuracy.png",
    ]
    for p in paths:
        assert p.parent == run / "plots"
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert p.stat().st_size > 5000


def test_partial_metrics_resumed_steps_and_out_dir(tmp_path, capsys):
    rows = [
        {"step": 1, "critic/score/mean": 0.1},
        {"step": 2, "critic/score/mean": 0.2},
        {"step": 2, "critic/score/mean": 0.25},  # resumed: the later value wins
        {"step": 3, "val/gsm8k/score": 0.5},
    ]
    run = write_run(tmp_path / "run", rows)
    with (run / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 4, "critic/sc')  # a crash mid-write
    assert load_metrics(run / "metrics.jsonl")["critic/score/mean"] == ([1, 2], [0.1, 0.25])
    assert main([str(run), "--out", str(tmp_path / "png")]) == 0
    printed = capsys.readouterr().out.split()
    assert sorted(printed) == [
        str(tmp_path / "png" / "reward.png"),
        str(tmp_path / "png" / "summary.png"),
        str(tmp_path / "png" / "val_accuracy.png"),
    ]


def test_summary_is_one_page_with_a_panel_per_metric_present(tmp_path):
    from matplotlib.image import imread

    full = [
        {
            "step": s,
            "critic/score/mean": s / 10,
            "val/arithmetic/acc": 0.3 + s / 20,
            "actor/ppo_kl": 0.01 * s,
            "actor/entropy": 1.0 - s / 20,
            "response_length/mean": 20 + s,
            "timing_s/step": 2.5,
        }
        for s in range(4)
    ]
    summary = plot_run(write_run(tmp_path / "full", full))[0]
    # Six panels: 3 columns x 2 rows of 5.0 x 3.6 inches at 100 dpi.
    assert imread(summary).shape[:2] == (720, 1500)
    # Only reward and step time logged: a one-row page of two panels, nothing else drawn.
    few = [{"step": s, "critic/score/mean": s / 10, "timing_s/step": 2.0} for s in range(1, 4)]
    paths = plot_run(write_run(tmp_path / "few", few))
    assert [p.name for p in paths] == ["summary.png", "reward.png", "step_time.png"]
    assert imread(paths[0]).shape[:2] == (360, 1000)


def test_errors_name_the_problem(tmp_path):
    missing = r"metrics file .*metrics\.jsonl does not exist: is this a run directory"
    with pytest.raises(DataError, match=missing):
        plot_run(tmp_path)
    write_run(tmp_path / "r", [{"step": 1, "timing_s/gen": 1.0}])
    with pytest.raises(DataError, match="none of the plotted metrics"):
        plot_run(tmp_path / "r")


# --- damaged metrics files: skipped lines, counted in one warning ---------------------------

GOOD = [{"step": s, "critic/score/mean": s / 10} for s in range(1, 4)]
DAMAGE = {
    "non-UTF-8 byte": b'{"step": 9, "critic/score/mean": 0.9, "x": "\xff"}',
    "JSON that is not an object": b"[1, 2, 3]",
    "5,000-digit number": b'{"step": 9, "critic/score/mean": ' + b"7" * 5_000 + b"}",
    "deep nesting": b'{"step": 9, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
}


@pytest.mark.parametrize("damage", list(DAMAGE), ids=list(DAMAGE))
def test_a_damaged_line_is_skipped_with_one_warning(tmp_path, caplog, capsys, damage):
    from rlcore.cli import main as rlcore

    run = tmp_path / "run"
    run.mkdir()
    lines = [json.dumps(r).encode() for r in GOOD]
    lines.insert(1, DAMAGE[damage])
    (run / "metrics.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    assert rlcore(["plot", str(run)]) == 0
    assert (run / "plots" / "reward.png").read_bytes()[:4] == b"\x89PNG"
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert [r.getMessage() for r in warnings] == [
        f"{run / 'metrics.jsonl'}: skipped 1 line(s) that are not JSON objects (first: line 2)"
    ]
    # The lines around it are all read.
    assert load_metrics(run / "metrics.jsonl")["critic/score/mean"] == ([1, 2, 3], [0.1, 0.2, 0.3])
    assert "Traceback" not in capsys.readouterr().err


def test_plotting_at_the_end_of_a_run_never_raises(tmp_path, caplog):
    from rlcore.trainer.run import _plot

    run = write_run(tmp_path / "run", GOOD)
    (run / "plots").write_text("a file where the plots folder goes")  # mkdir: FileExistsError
    assert _plot(run) == []
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning.startswith(f"plotting {run} failed (FileExistsError: ")
    assert warning.endswith(f"training is unaffected; rerun rlcore plot {run}")


# --- issue 49 item 7: a panel whose metric the run does not compute says so ------------------


def _panel(series, stem, keys):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rlcore.tracking.plotting import draw_panel

    fig, ax = plt.subplots()
    draw_panel(ax, series, stem, "title", "y", keys)
    lines = [line.get_label() for line in ax.lines]
    texts = [t.get_text() for t in ax.texts]
    plt.close(fig)
    return lines, texts


def test_a_kl_that_is_zero_at_every_step_is_a_note_not_a_flat_line():
    steps = [1, 2, 3]
    series = {"actor/ppo_kl": (steps, [0.0, 0.0, 0.0])}
    lines, texts = _panel(series, "kl", ["actor/ppo_kl"])
    assert lines == []
    assert texts == ["actor/ppo_kl: 0 at every step\nnot computed by this run (no such term)"]
    # Beside a KL that was computed, the absent one is named and the other drawn.
    series["actor/kl_loss"] = (steps, [0.0, 0.01, 0.02])
    lines, texts = _panel(series, "kl", ["actor/ppo_kl", "actor/kl_loss"])
    assert lines == ["actor/kl_loss"]
    assert texts == ["actor/ppo_kl: 0 at every step"]
    # A reward of 0 at every step is a measurement: drawn.
    lines, texts = _panel(
        {"critic/score/mean": (steps, [0.0] * 3)}, "reward", ["critic/score/mean"]
    )
    assert (lines, texts) == (["critic/score/mean"], [])


def test_the_summary_of_a_run_without_kl_keeps_the_panel_with_its_note(tmp_path):
    rows = [{"step": s, "critic/score/mean": s / 10, "actor/ppo_kl": 0.0} for s in range(1, 4)]
    paths = plot_run(write_run(tmp_path / "run", rows))
    assert [p.name for p in paths] == ["summary.png", "reward.png", "kl.png"]
