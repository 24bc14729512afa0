"""The requests rlcore builds, fed to SGLang's own argument classes (where SGLang imports).

Skipped where SGLang is absent (CI). ``ServerArgs`` and ``SamplingParams`` are pure Python, so
this runs wherever the ``sglang`` package and its light dependencies import, GPU or not; it was
run against SGLang 0.5.23 installed with ``pip install --no-deps --target`` next to the CPU torch.
"""

from __future__ import annotations

import pytest

from rlcore.errors import ConfigError
from rlcore.interfaces import RolloutSpec
from rlcore.interfaces import SamplingParams as RlcoreSampling
from rlcore_sglang.rollout import SGLangRollout, _check_server_arg_names
from rlcore_sglang.translate import sampling_params_dict

sampling_params = pytest.importorskip("sglang.srt.sampling.sampling_params")
server_args = pytest.importorskip("sglang.srt.server_args")


def test_server_args_accept_every_key_rlcore_sets():
    spec = RolloutSpec(model_path="/m", dtype="bfloat16", seed=3)
    config = SGLangRollout.Config(tensor_parallel_size=2, server_args={"disable_radix_cache": True})
    kwargs = SGLangRollout.server_kwargs(spec, config, base_gpu_id=1)
    args = server_args.ServerArgs(**kwargs)
    assert {k: getattr(args, k) for k in kwargs} == kwargs


def test_unknown_server_args_are_named_with_their_key_path():
    _check_server_arg_names({"disable_radix_cache": True}, "v")
    with pytest.raises(ConfigError, match=r"^rollout.server_args.nope: not a ServerArgs field"):
        _check_server_arg_names({"nope": 1}, "v")


@pytest.mark.parametrize(
    ("sampling", "temperature", "top_k"),
    [
        (RlcoreSampling(temperature=0.7, top_p=0.9, top_k=20), 0.7, 20),
        (RlcoreSampling(do_sample=False), 1.0, 1),  # greedy: SGLang's top_k = 1
        (RlcoreSampling(top_k=0), 1.0, sampling_params.TOP_K_ALL),  # off
        (RlcoreSampling(top_k=-1), 1.0, sampling_params.TOP_K_ALL),
    ],
)
def test_sampling_dicts_pass_sglangs_own_checks(sampling, temperature, top_k):
    params = sampling_params.SamplingParams(
        **sampling_params_dict(sampling, stop_token_ids=[2, 5], seed=11)
    )
    params.verify(1000)
    params.normalize(None)
    assert (params.temperature, params.top_k) == (temperature, top_k)
    assert params.stop_token_ids == {2, 5}
    assert (params.n, params.sampling_seed, params.ignore_eos) == (1, 11, False)


def test_building_with_sglang_but_no_gpu_is_one_line(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(ConfigError) as cpu:
        SGLangRollout(RolloutSpec(model_path=str(tmp_path), device="cpu"))
    assert str(cpu.value).startswith(
        "rollout 'sglang' needs a CUDA GPU but [resources] device = 'cpu'"
    )
    with pytest.raises(ConfigError) as none:
        SGLangRollout(RolloutSpec(model_path=str(tmp_path), device="cuda"))
    assert str(none.value) == (
        "rollout 'sglang' needs 1 CUDA GPU(s) (rollout.tensor_parallel_size) in this process, "
        "torch sees 0"
    )
