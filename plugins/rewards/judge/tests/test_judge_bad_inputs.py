"""Bad input for the judge: each one line from ``rlcore train`` (exit 2, no traceback), from
the config's own checks, so before Ray starts."""

from __future__ import annotations

import _bad_inputs as bi
import pytest

from rlcore.config import load_config_text

registry, tiny, run = bi.registry, bi.tiny, bi.run  # fixtures


def case(run, capsys, registry, overrides, expected) -> None:
    """One line naming the config file and the key (a config error: the loader's checks)."""
    code, err = bi.train_preflight(run, overrides, capsys, registry)
    bi.assert_one_line(code, err, f"{run}: {expected}")


def _judge(model, **options) -> list[str]:
    items = {"model_path": str(model), **options}
    return ['reward.default="judge"'] + [
        f"reward.options.judge.{k}={v!r}".replace("'", '"') for k, v in items.items()
    ]


def test_a_template_without_the_response_placeholder_is_one_line(run, capsys, registry, tiny):
    case(
        run,
        capsys,
        registry,
        _judge(tiny, template="Is this right? {prompt} Answer [[0-10]]."),
        "reward.options.judge.template: has no {response} placeholder, so the judge would not "
        "see the answer it scores; add {response} (placeholders: {prompt}, {response}, "
        "{ground_truth})",
    )


def test_an_unknown_placeholder_is_one_line(run, capsys, registry, tiny):
    case(
        run,
        capsys,
        registry,
        _judge(tiny, template="{response} vs {answer}"),
        "reward.options.judge.template: has an unknown placeholder {answer}; the "
        "placeholders are {prompt}, {response}, {ground_truth} (write a literal brace as "
        "{{ or }})",
    )


def test_a_judge_model_path_that_does_not_exist_is_one_line(run, capsys, registry, tmp_path):
    # A file check (preflight, with model.path's), so the line names no config file.
    missing = tmp_path / "no-judge"
    bi.case(
        run,
        capsys,
        registry,
        _judge(missing),
        f"reward.options.judge.model_path: {missing} does not exist; give a local Hugging "
        "Face model folder",
    )


def test_a_judge_without_a_model_path_is_one_line(run, capsys, registry):
    case(
        run,
        capsys,
        registry,
        ['reward.default="judge"'],
        "reward.options.judge.model_path: is required: a local Hugging Face model folder "
        "(the judge model)",
    )


def test_a_judge_folder_without_weights_is_one_line(run, capsys, registry, tiny, tmp_path):
    empty = bi.model_copy(tiny, tmp_path / "judge")
    bi.weights_file(empty).unlink()
    bi.case(
        run,
        capsys,
        registry,
        _judge(empty),
        f"reward.options.judge.model_path: {empty} has no weights (*.safetensors or "
        "pytorch_model*.bin); download or save the model there",
    )


def test_bad_rollout_options_for_the_judge_are_one_line(run, capsys, registry, tiny):
    overrides = [*_judge(tiny), "reward.options.judge.rollout_options.max_batch_sise=4"]
    code, err = bi.train_preflight(run, overrides, capsys, registry)
    assert code == 2
    assert err.count("\n") == 1
    assert err.startswith(
        "error: reward.options.judge.rollout_options.max_batch_sise: unknown key (did you "
        "mean 'max_batch_size'?)"
    )


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        ({"score_pattern": "(\\d)/(\\d)"}, "reward.options.judge.score_pattern: has 2 capture"),
        ({"scale": [10, 0]}, "reward.options.judge.scale: must be [low, high]"),
        ({"out_of_range": "wrap"}, 'reward.options.judge.out_of_range: must be one of "unp'),
    ],
)
def test_parser_options_are_checked_when_the_config_loads(
    run, capsys, registry, tiny, option, expected
):
    code, err = bi.train_preflight(run, _judge(tiny, **option), capsys, registry)
    assert code == 2
    assert err.count("\n") == 1
    assert err.startswith(f"error: {run}: {expected}")


def test_a_valid_judge_config_loads(run, registry, tiny):
    from rlcore.config import load_config

    config = load_config(run, _judge(tiny, template="Grade: {response}"), registry=registry)
    assert config.reward.options["judge"].template == "Grade: {response}"
    assert load_config_text  # the text loader is the same path (used by the run test)
