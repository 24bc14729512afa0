"""``[agent] harness``: agent code as a black box, trained from the endpoint's recorded tokens.

:class:`HarnessLoop` has the agent loop's face (``generate(rollout, prompts, sampling)`` ->
the rollout layout), run inside the rollout's worker. For each row it opens a session on the
replica's OpenAI-compatible endpoint (:class:`~rlcore.agent.endpoint.EndpointServer`,
started on first use), runs the harness plugin on the row's task with that session's
``base_url`` and the run's API key, closes the session and assembles the samples from the
recorded calls (:mod:`rlcore.agent.trajectory`): one row per sample, so a trajectory the
harness split (it edited history) gives several rows, each with ``agent_row`` naming the
prompt row it came from (:func:`rlcore.rl.step.join_generated` expands the batch to match).

A harness that hangs (past ``harness_timeout_s``), crashes, returns nothing, floods the
endpoint (past ``max_calls_per_sample``) or whose environment's ``step`` raises costs its own
sample only: the row keeps its place with a zero loss mask (no gradient), and the failure is
counted (``agent/harness_failures``, ``agent/harness_timeouts``, ``agent/env_errors``,
``agent/endpoint_refused``) and named in one log line per kind and batch.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import attrs

from rlcore.agent.trajectory import Segment, check_faithfulness, segments
from rlcore.errors import RlcoreError
from rlcore.interfaces import BaseEnvironment, HarnessResult, HarnessTask
from rlcore.rl.step import AGENT_ROW_KEY

if TYPE_CHECKING:
    from rlcore.agent.endpoint import EndpointServer
    from rlcore.config.schema import AgentConfig
    from rlcore.interfaces import BaseRollout, SamplingParams
    from rlcore.plugins import Component
    from rlcore.protocol import DataProto

log = logging.getLogger(__name__)

__all__ = [
    "EnvironmentStepError",
    "GuardedEnvironment",
    "HarnessLoop",
]

_GRACE_S = 2.0  # a child's result write and exit, on top of harness_timeout_s


class EnvironmentStepError(RlcoreError):
    """An environment's ``reset``/``step`` raised; ends its sample only."""


class GuardedEnvironment(BaseEnvironment):
    """An environment whose errors name it (one line) instead of surfacing as the harness's."""

    def __init__(self, env: BaseEnvironment, name: str) -> None:
        super().__init__()
        self.env, self.name = env, name

    def _call(self, what: str, *args: Any) -> Any:
        try:
            return getattr(self.env, what)(*args)
        except Exception as err:
            msg = f"environment {self.name!r} {what} raised {type(err).__name__}: {err}"
            raise EnvironmentStepError(msg[:300]) from err

    def reset(self, task: Any) -> tuple[str, dict[str, Any]]:
        out: tuple[str, dict[str, Any]] = self._call("reset", task)
        return out

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        out: tuple[str, float, bool, bool, dict[str, Any]] = self._call("step", action)
        return out


@attrs.define
class _Run:
    """One row's harness run: its outcome and the calls the endpoint recorded."""

    task: HarnessTask
    result: HarnessResult | None = None
    failure: str | None = None  # "timeout", "crash", "empty", "env", "flood"
    error: str = ""
    segments: list[Segment] = attrs.Factory(list)
    refused: int = 0


def _target(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _options(config: Any) -> dict[str, Any] | None:
    return None if config is None else attrs.asdict(config)


class HarnessLoop:
    """Runs the ``[agent] harness`` plugin per row; see the module docstring."""

    def __init__(
        self,
        tokenizer: Any,
        harness: Component,
        config: AgentConfig,
        environment: Component | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.config = config
        self.harness_component = harness
        self.harness_cls = harness.resolve()
        self.environment_component = environment
        self.env_cls = None if environment is None else environment.resolve()
        self.weight_version = 0  # the rollout worker sets it before each generate
        self.server: EndpointServer | None = None
        # The last batch's samples, row by row (None: a failed run's row), for inspection and
        # the conformance check.
        self.last_samples: list[Segment | None] = []
        self.special_ids = {int(t) for t in getattr(tokenizer, "all_special_ids", ()) or ()}
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = int(pad if pad is not None else tokenizer.eos_token_id)

    # --- the endpoint ---------------------------------------------------------------------

    def endpoint(self, rollout: BaseRollout) -> EndpointServer:
        from rlcore.agent.endpoint import EndpointLimits, EndpointServer
        from rlcore.agent.parsers import get_parser

        if self.server is None or self.server.rollout is not rollout:
            if self.server is not None:
                self.server.stop()
            cfg = self.config
            limits = EndpointLimits(
                request_timeout_s=cfg.request_timeout_s,
                max_tokens_per_call=cfg.max_tokens_per_turn or 1 << 20,
                max_request_bytes=cfg.max_request_bytes,
                max_calls=cfg.max_calls_per_sample,
            )
            self.server = EndpointServer(
                rollout, self.tokenizer, parser=get_parser(cfg.tool_parser, []), limits=limits,
                version=lambda: self.weight_version,
            ).start()  # fmt: skip
        return self.server

    # --- the batch face -------------------------------------------------------------------

    def generate(
        self, rollout: BaseRollout, prompts: DataProto, sampling: SamplingParams
    ) -> DataProto:
        server = self.endpoint(rollout)
        tasks = tasks_of(prompts, self.tokenizer)
        workers = min(len(tasks), self.config.max_parallel_conversations) or 1
        with ThreadPoolExecutor(workers, thread_name_prefix="rlcore-harness") as pool:
            runs = list(pool.map(lambda t: self._run(server, t, sampling), tasks))
        self._report(runs)
        return self.to_dataproto(prompts, runs, sampling)

    def _run(self, server: EndpointServer, task: HarnessTask, sampling: SamplingParams) -> _Run:
        run = _Run(task=task)
        sid = server.open_session(sampling, budget=sampling.max_new_tokens)
        try:
            if self.config.harness_isolation == "thread":
                self._in_thread(run, server, sid)
            else:
                self._in_process(run, server, sid)
        finally:
            session = server.close_session(sid)
        run.refused = sum(session.refused.values())
        if run.failure is None and session.refused.get("flood"):
            run.failure, run.error = "flood", f"{session.refused['flood']} calls over the limit"
        if run.failure is None:
            run.segments = segments(session.calls)
        return run

    def _environment(self) -> GuardedEnvironment | None:
        comp = self.environment_component
        if comp is None or self.env_cls is None:
            return None
        return GuardedEnvironment(self.env_cls(comp.options), comp.name)

    def _in_thread(self, run: _Run, server: EndpointServer, sid: str) -> None:
        harness = self.harness_cls(self.harness_component.options)
        env = self._environment()
        task = run.task if env is None else run.task.with_environment(env)
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = harness.run(task, server.base_url(sid), server.api_key)
            except BaseException as err:  # reported as this sample's failure
                box["error"] = err

        thread = threading.Thread(target=target, name="rlcore-harness-run", daemon=True)
        thread.start()
        thread.join(self.config.harness_timeout_s)
        if thread.is_alive():  # abandoned: its session closes, later calls get 410
            run.failure, run.error = (
                "timeout",
                f"past harness_timeout_s={self.config.harness_timeout_s}",
            )
        elif "error" in box:
            err = box["error"]
            run.failure = "env" if isinstance(err, EnvironmentStepError) else "crash"
            run.error = f"{type(err).__name__}: {err}"[:500]
        else:
            self._settle(run, HarnessResult.coerce(box.get("value")), box.get("value"))

    def _in_process(self, run: _Run, server: EndpointServer, sid: str) -> None:
        comp, env = self.harness_component, self.environment_component
        request = {
            "harness": _target(self.harness_cls),
            "harness_options": _options(comp.options),
            "environment": None if self.env_cls is None else _target(self.env_cls),
            "environment_name": None if env is None else env.name,
            "environment_options": None if env is None else _options(env.options),
            "task": run.task.to_json(),
            "base_url": server.base_url(sid),
            "api_key": server.api_key,
            "memory_mb": self.config.harness_memory_mb,
        }
        with tempfile.TemporaryDirectory(prefix="rlcore-harness-") as tmp:
            req, res = os.path.join(tmp, "request.json"), os.path.join(tmp, "result.json")
            with open(req, "w", encoding="utf-8") as f:
                json.dump(request, f)
            with open(os.path.join(tmp, "stderr"), "w+b") as err_file:
                proc = subprocess.Popen(  # our own module, our JSON files
                    [sys.executable, "-m", "rlcore.agent.harness_child", req, res],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err_file,
                    start_new_session=True,  # its own group: a kill takes its children too
                    env=_child_env(),
                )  # fmt: skip
                try:
                    proc.wait(self.config.harness_timeout_s + _GRACE_S)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
                    run.failure = "timeout"
                    run.error = f"past harness_timeout_s={self.config.harness_timeout_s}"
                    return
                err_file.seek(max(0, os.path.getsize(err_file.name) - 400))
                tail = err_file.read().decode(errors="replace").strip().splitlines()
            try:
                with open(res, encoding="utf-8") as f:
                    outcome = json.load(f)
            except (OSError, ValueError):
                last = tail[-1] if tail else ""
                run.failure, run.error = "crash", f"exit {proc.returncode}: {last}"[:500]
                return
        if outcome.get("ok"):
            self._settle(run, HarnessResult.coerce(outcome.get("result")), outcome.get("result"))
        else:
            run.failure, run.error = str(outcome.get("kind", "crash")), str(outcome.get("error"))

    @staticmethod
    def _settle(run: _Run, result: HarnessResult | None, value: Any) -> None:
        if result is None:
            run.failure, run.error = "empty", f"returned {type(value).__name__}"
        else:
            run.result = result

    def _report(self, runs: Sequence[_Run]) -> None:
        """One line per failure kind in this batch, naming the plugin and what to fix."""
        name = self.harness_component.name
        hints = {
            "timeout": "it ran past [agent] harness_timeout_s",
            "crash": "it raised or its process died",
            "empty": "it returned nothing: return a HarnessResult or the answer string",
            "env": "its environment raised",
            "flood": "it called past [agent] max_calls_per_sample",
        }
        for kind, hint in hints.items():
            failed = [r for r in runs if r.failure == kind]
            if failed:
                log.warning(
                    "agent: harness %r failed on %d of %d rows (%s; first: %s); those samples "
                    "get no gradient", name, len(failed), len(runs), hint, failed[0].error,
                )  # fmt: skip

    # --- tensors --------------------------------------------------------------------------

    def to_dataproto(
        self, prompts: DataProto, runs: Sequence[_Run], sampling: SamplingParams
    ) -> DataProto:
        import numpy as np
        import torch

        from rlcore.engine import rollout_tensors
        from rlcore.protocol import DataProto

        P = int(prompts.batch["input_ids"].shape[1])
        R = sampling.max_new_tokens
        rows: list[tuple[int, Segment | None, _Run, int]] = []  # (source, sample, run, part)
        for i, run in enumerate(runs):
            if run.failure is None and run.segments:
                rows += [(i, seg, run, k) for k, seg in enumerate(run.segments)]
            else:
                rows.append((i, None, run, 0))
        B, pad = len(rows), self.pad_token_id
        prompt_ids = torch.full((B, P), pad, dtype=torch.long)
        prompt_mask = torch.zeros(B, P, dtype=torch.long)
        responses = torch.full((B, R), pad, dtype=torch.long)
        response_mask = torch.zeros(B, R, dtype=torch.long)
        seen = torch.zeros(B, R, dtype=torch.long)
        log_probs = torch.zeros(B, R, dtype=torch.float32)
        self.last_samples = [seg for _, seg, _, _ in rows]
        summaries = np.empty(B, dtype=object)
        source = np.empty(B, dtype=np.int64)
        mismatches = truncated = 0
        for b, (i, seg, run, part) in enumerate(rows):
            source[b] = i
            if seg is None:  # a failed run keeps its place, with nothing to learn from
                src = prompts.batch["input_ids"][i]
                prompt_ids[b], prompt_mask[b] = src, prompts.batch["attention_mask"][i]
                summaries[b] = self._summary(run, None, part, mismatch=False)
                continue
            full_prompt = seg.prompt_ids
            head = full_prompt[:P]  # a longer prompt (a split's history) spills into the response
            resp, mask, lps = seg.response()
            resp = full_prompt[P:] + resp
            mask = [0] * (len(full_prompt) - len(head)) + mask
            lps = [0.0] * (len(full_prompt) - len(head)) + lps
            cut = len(resp) > R  # a split's long history can outgrow the response budget
            if cut:
                truncated += 1
                resp, mask, lps = resp[:R], mask[:R], lps[:R]
            prompt_ids[b, P - len(head) :] = torch.tensor(head)
            prompt_mask[b, P - len(head) :] = 1
            n = len(resp)
            responses[b, :n] = torch.tensor(resp, dtype=torch.long)
            response_mask[b, :n] = torch.tensor(mask, dtype=torch.long)
            seen[b, :n] = 1
            log_probs[b, :n] = torch.tensor(lps)
            check = check_faithfulness(seg, self.tokenizer, stop_ids=self.special_ids)
            mismatches += int(check.mismatch)
            summaries[b] = self._summary(run, seg, part, mismatch=check.mismatch)
            summaries[b]["retokenize_position"] = check.position
            summaries[b]["truncated"] = cut
        from rlcore.engine import position_ids_from_mask

        tensors = rollout_tensors(
            prompt_ids, prompt_mask, position_ids_from_mask(prompt_mask), responses, response_mask,
            log_probs=log_probs if sampling.return_log_probs else None, response_attention=seen,
        )  # fmt: skip
        n_runs = max(1, len(runs))
        failures = [r.failure for r in runs]
        metrics = {
            "agent/retokenize_mismatch": float(mismatches),
            "agent/splits": float(B - len(runs)),
            "agent/harness_failures": float(sum(f is not None for f in failures)),
            "agent/harness_timeouts": float(failures.count("timeout")),
            "agent/env_errors": float(failures.count("env")),
            "agent/endpoint_refused": float(sum(r.refused for r in runs)),
            "agent/calls": sum(len(c.calls) for r in runs for c in r.segments) / n_runs,
            "agent/truncated": truncated / max(1, B),
        }
        return DataProto.from_dict(
            tensors=tensors,
            non_tensors={"agent": summaries, AGENT_ROW_KEY: source},
            meta_info={"metrics": {k: [v] for k, v in metrics.items()}},
        )

    def _summary(
        self, run: _Run, seg: Segment | None, part: int, *, mismatch: bool
    ) -> dict[str, Any]:
        """What the reward function reads (merged into ``extra_info``): the conversation with
        the harness's answer as its last assistant turn, tool counts, the harness's inputs."""
        turns: list[dict[str, Any]] = []
        if run.segments:
            last = run.segments[-1].calls[-1]
            turns = [dict(m) for m in last.messages or [] if isinstance(m, dict)]
            turns.append({"role": "assistant", "content": last.text})
        result = run.result
        if result is not None and result.answer is not None:
            if turns and turns[-1].get("role") == "assistant":
                turns[-1] = {"role": "assistant", "content": result.answer}
            else:
                turns.append({"role": "assistant", "content": result.answer})
        tool_msgs = [t for t in turns if t.get("role") == "tool"]
        errors = sum(str(t.get("content", "")).startswith("error") for t in tool_msgs)
        return {
            "turns": turns,
            "num_turns": sum(t.get("role") == "assistant" for t in turns),
            "tool_calls": len(tool_msgs),
            "tool_errors": errors,
            "truncated": False,
            "harness_failure": run.failure,
            "split_part": part,
            "weight_versions": [] if seg is None else seg.weight_versions,
            "retokenize_mismatch": mismatch,
            **(result.reward_inputs if result is not None else {}),
        }


def tasks_of(prompts: DataProto, tokenizer: Any) -> list[HarnessTask]:
    """Each row's task from the prompt batch's task columns (the driver sends ``raw_prompt``,
    ``reward_model``, ``data_source`` and ``extra_info`` with the prompts)."""
    import numpy as np

    nt = prompts.non_tensor_batch
    n = len(prompts)
    raw = nt.get("raw_prompt")
    tasks = []
    for i in range(n):
        if raw is not None and isinstance(raw[i], list | tuple | np.ndarray):
            messages = [dict(m) for m in raw[i]]
        else:  # no chat rows: the prompt's text as one user message
            ids = prompts.batch["input_ids"][i][prompts.batch["attention_mask"][i].bool()]
            messages = [
                {"role": "user", "content": tokenizer.decode(ids, skip_special_tokens=True)}
            ]
        rm = nt["reward_model"][i] if "reward_model" in nt else None
        tasks.append(
            HarnessTask(
                messages=messages,
                ground_truth=rm.get("ground_truth") if isinstance(rm, dict) else None,
                data_source=str(nt["data_source"][i]) if "data_source" in nt else "",
                extra_info=dict(nt["extra_info"][i])
                if "extra_info" in nt and isinstance(nt["extra_info"][i], dict)
                else {},
                index=i,
            )
        )
    return tasks


def _child_env() -> dict[str, str]:
    """The worker's environment, with its import path: a harness (or environment) the worker
    imported from a module that is not installed (a script's folder, a test's) imports in the
    child too."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
