"""Bad-input catalogue: ``[reward_model]``. Each case is one exact line from ``rlcore train``
or ``rlcore config validate`` (exit 2, no traceback), before Ray starts."""

from __future__ import annotations

import _bad_inputs as bi

registry, tiny, run = bi.registry, bi.tiny, bi.run  # fixtures


def test_a_reward_model_path_that_does_not_exist_is_one_line(run, capsys, registry, tmp_path):
    missing = tmp_path / "no-rm"
    bi.case(
        run,
        capsys,
        registry,
        ["reward_model.enable=true", f'reward_model.model.path="{missing}"'],
        f"reward_model.model.path: {missing} does not exist; give a local Hugging Face "
        "model folder",
    )


def test_a_causal_lm_folder_is_not_a_reward_model(run, capsys, registry, tiny):
    bi.case(
        run,
        capsys,
        registry,
        ["reward_model.enable=true", f'reward_model.model.path="{tiny}"'],
        f"reward_model.model.path: {tiny} is not a sequence-classification model "
        "(architectures: Qwen2ForCausalLM); save the reward model with "
        "AutoModelForSequenceClassification (num_labels = 1)",
    )


def test_a_classifier_with_two_labels_is_not_a_reward_model(run, capsys, registry, tiny, tmp_path):
    import json

    folder = bi.model_copy(tiny, tmp_path / "two-labels")
    config = json.loads((folder / "config.json").read_text())
    config |= {
        "architectures": ["Qwen2ForSequenceClassification"],
        "id2label": {"0": "a", "1": "b"},
    }
    (folder / "config.json").write_text(json.dumps(config))
    bi.case(
        run,
        capsys,
        registry,
        ["reward_model.enable=true", f'reward_model.model.path="{folder}"'],
        f"reward_model.model.path: {folder} has 2 labels; a reward model scores with one "
        "(num_labels = 1)",
    )


def test_an_enabled_reward_model_without_a_path_is_one_line(run, capsys, registry):
    code, err = bi.cli(
        ["config", "validate", str(run), "reward_model.enable=true"], capsys, registry
    )
    assert code == 2
    assert (
        "reward_model.model.path: reward_model.enable is true: set it to the reward model's "
        "local folder"
    ) in err


def test_rm_is_the_reward_models_name_not_a_reward_to_select(run, capsys, registry, tiny):
    code, err = bi.cli(
        ["config", "validate", str(run), 'reward.default=["gsm8k", "rm"]'], capsys, registry
    )
    assert code == 2
    assert (
        "reward.default: 'rm' is the reward model's scorer: set [reward_model] enable and "
        "weight instead"
    ) in err
