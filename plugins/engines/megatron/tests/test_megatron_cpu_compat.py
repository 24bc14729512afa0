"""The CPU compatibility layer: patches only inside the block, restored after, and the plugin
module stays light."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from rlcore.testing.conformance import check_plugin_module
from rlcore_megatron.cpu_compat import CpuRNGStatesTracker, cpu_compat


def test_cuda_calls_answer_cpu_inside_the_block_only():
    original = (torch.cuda.current_device, torch.cuda.synchronize)
    with cpu_compat():
        assert torch.cuda.current_device() == "cpu"
        with cpu_compat():  # re-entrant: the inner exit restores nothing yet
            torch.cuda.synchronize()
        counter = torch.zeros([], dtype=torch.int, device="cuda")
        assert counter.device.type == "cpu"
        t = torch.ones(2)
        assert t.cuda() is t
        assert torch.cuda.current_device() == "cpu"
        assert not torch.cuda.is_available()  # not patched: code still knows it is on CPU
    assert (torch.cuda.current_device, torch.cuda.synchronize) == original
    if not torch.cuda.is_available():
        with pytest.raises((AssertionError, RuntimeError)):
            torch.zeros(1, device="cuda")


def test_tensor_type_reads_as_on_a_gpu_inside_the_block_only():
    """megatron's optimizers accept parameters by their CUDA type names
    (optimizer/distrib_optimizer.py:361,420; optimizer/optimizer.py:671,690)."""
    p = torch.nn.Parameter(torch.zeros(2))
    with cpu_compat():
        assert p.type() == "torch.cuda.FloatTensor"
        assert torch.zeros(1, dtype=torch.bfloat16).type() == "torch.cuda.BFloat16Tensor"
        assert p.type(torch.float64).dtype == torch.float64  # a conversion stays a conversion
        assert p.device.type == "cpu"
    assert p.type() == "torch.FloatTensor"


def test_rng_tracker_forks_its_own_stream_and_restores_the_callers():
    tracker = CpuRNGStatesTracker()
    tracker.add("model-parallel-rng", 123)
    torch.manual_seed(0)
    with tracker.fork():
        first = torch.rand(3)
    outer = torch.rand(3)
    with tracker.fork():
        second = torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(outer, torch.rand(3))  # the forks did not advance the caller's stream
    expected = torch.Generator().manual_seed(123)
    assert torch.equal(first, torch.rand(3, generator=expected))
    assert torch.equal(second, torch.rand(3, generator=expected))  # the fork's stream advanced
    with pytest.raises(RuntimeError, match="already exists"):
        tracker.add("other", 123)
    with pytest.raises(RuntimeError, match="not added"), tracker.fork("missing"):
        pass
    states = tracker.get_states()
    tracker.reset()
    assert not tracker.is_initialized()
    tracker.set_states(states)
    assert set(tracker.get_states()) == {"model-parallel-rng"}


def test_plugin_module_imports_nothing_heavy():
    assert check_plugin_module("rlcore_megatron.plugin") == {
        "engine/megatron": "rlcore_megatron.engine:MegatronEngine"
    }
    code = (
        "import sys, rlcore_megatron.plugin as p; "
        "heavy = [m for m in ('torch', 'transformers', 'megatron', 'ray') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
