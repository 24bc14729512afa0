"""Bad-input catalogue: what the selected engine and rollout check before Ray starts (their
``preflight``, :mod:`rlcore.preflight.plugins`) — each once a multi-line remote traceback from
a worker (issue 31, item 9). Each case is one exact line from ``rlcore train``, exit 2, no
traceback, and Ray never starts."""

from __future__ import annotations

import _bad_inputs as bi
import pytest

registry, tiny, run = bi.registry, bi.tiny, bi.run  # fixtures

LINEAR = "down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj"


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    """Every case ends before Ray: starting it fails the test."""
    import rlcore.workers.cluster

    def start_ray(resources):
        pytest.fail("Ray was started: the check did not run before it")

    monkeypatch.setattr(rlcore.workers.cluster, "start_ray", start_ray)


@pytest.mark.parametrize(
    ("targets", "shown"),
    [('["nope"]', '["nope"]'), ('"mlp\\\\.nothing.*"', '"mlp\\\\.nothing.*"')],
    ids=["list", "regex"],
)
def test_lora_targets_that_match_no_module(run, capsys, registry, tiny, targets, shown):
    """Checked against the model built on the meta device from its config.json."""
    bi.case(
        run,
        capsys,
        registry,
        ["actor.engine.lora_rank=4", f"actor.engine.target_modules={targets}"],
        f"actor.engine.target_modules = {shown} matches no module of the model at {tiny} "
        f'(Qwen2ForCausalLM); its linear layers are {LINEAR} (or use "all-linear")',
    )


def test_fsdp_size_that_does_not_divide_the_processes(run, capsys, registry):
    bi.case(
        run,
        capsys,
        registry,
        ["actor.engine.fsdp_size=2"],
        "actor.engine.fsdp_size = 2 must divide the number of processes (1: resources.nnodes x "
        "resources.processes_per_node); -1: all",
    )


def test_megatron_tensor_parallel_on_one_process(run, capsys, registry):
    bi.case(
        run,
        capsys,
        registry,
        ['actor.engine.name="megatron"', "actor.engine.tensor_parallel=2"],
        "actor.engine.tensor_parallel * pipeline_parallel = 2 * 1 = 2 must divide the number "
        "of processes (1: resources.nnodes x resources.processes_per_node)",
    )


def test_megatron_tensor_parallel_that_does_not_divide_the_heads(run, capsys, registry, tiny):
    """The tiny model has 2 attention heads and 1 KV head: TP = 2 over 2 processes cannot
    split the KV head."""
    bi.case(
        run,
        capsys,
        registry,
        [
            'actor.engine.name="megatron"',
            "actor.engine.tensor_parallel=2",
            "resources.processes_per_node=2",
        ],
        "actor.engine.tensor_parallel = 2 must divide num_attention_heads=2 and "
        f"num_key_value_heads=1 of the model at {tiny}",
    )


def test_vllm_tensor_parallel_on_cpu(run, capsys, registry):
    """A config check: vLLM itself need not be installed."""
    bi.case(
        run,
        capsys,
        registry,
        ['rollout.name="vllm"', "rollout.tensor_parallel_size=2"],
        "[rollout] tensor_parallel_size = 2 is refused on CPU: the vLLM CPU build's "
        "tensor-parallel engine did not start within 600 s on a 2-core machine; use "
        "tensor_parallel_size = 1 and more policy workers (resources.processes_per_node)",
    )


def test_vllm_tensor_parallel_that_does_not_divide_the_workers(run, capsys, registry):
    bi.case(
        run,
        capsys,
        registry,
        [
            'rollout.name="vllm"',
            "rollout.tensor_parallel_size=2",
            'resources.device="cuda"',
            "resources.processes_per_node=3",
        ],
        "[rollout] tensor_parallel_size = 2 must divide the number of policy workers (3: "
        "resources.nnodes x resources.processes_per_node); each TP rank is one worker",
    )
