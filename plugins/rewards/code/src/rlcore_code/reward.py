"""The ``code`` reward: 1 when the response's Python passes the row's tests in a sandbox.

A row carries its tests as ``reward_model.ground_truth``: Python run after the response's
code in the same namespace, raising (an ``assert``) on a wrong answer. HumanEval's rows
(``examples/data/humaneval.py``) hold the problem's ``check(candidate)`` followed by
``check(<entry_point>)``; ``extra_info["code_prefix"]`` holds the prompt's code, put before
the response (a completion continues it, a whole function redefines its stub).

Each row also gets a ``reason``, which the reward manager counts as ``reward/reason/<reason>``:

============== =======================================================================
``pass``       the code and the tests ran to the end (score 1)
``fail``       a test's ``assert`` failed
``error``      another exception (``error`` names its type: ``NameError``, ``OSError``...)
``exit``       ``SystemExit`` (``exit()``, ``sys.exit``) before the tests finished
``memory``     ``MemoryError`` (the address-space limit)
``timeout``    past the wall clock or the CPU-time limit
``output_limit`` more output than ``max_output_bytes``
``syntax``     the code does not compile
``no_code``    the response holds no Python (empty, or only blocks in other languages)
``bad_test``   the row's tests are empty or do not compile (a data problem)
``crash``      the program ended without a verdict (``os._exit``, a signal, a dead init)
============== =======================================================================
"""

from __future__ import annotations

import secrets
import signal
from typing import Any

import attrs

from rlcore.interfaces import BaseReward, key
from rlcore_code.extract import Block, extract_code, with_prefix
from rlcore_code.sandbox import RunResult, SandboxOptions, run_in_sandbox

__all__ = ["REASONS", "CodeReward", "judge", "run_tests"]

REASONS = (
    "pass", "fail", "error", "exit", "memory", "timeout", "output_limit", "syntax",
    "no_code", "bad_test", "crash",
)  # fmt: skip
# bwrap exits with 128 + the signal that ended the tests' process; its RLIMIT_CPU sends
# SIGXCPU, which it does not catch. (The candidate's CPU time is the tests' process's verdict;
# a SIGKILL here is the candidate killing its parent: a crash.)
_CPU_SIGNALS = {128 + signal.SIGXCPU, -signal.SIGXCPU}


def judge(result: RunResult, token: str) -> tuple[str, str]:
    """``(reason, detail)`` of a run: the harness's verdict line, else how it ended."""
    prefix = token.encode() + b" "
    verdicts = [line for line in result.output.splitlines() if line.startswith(prefix)]
    if len(verdicts) > 1:  # the tests' process writes one: another came from elsewhere
        return "crash", "more than one verdict line"
    if verdicts:
        verdict = verdicts[0][len(prefix) :].decode(errors="replace").split(" ", 1)
        if verdict[0] in REASONS:
            return verdict[0], verdict[1] if len(verdict) > 1 else ""
    if result.output_exceeded:
        return "output_limit", ""
    if result.timed_out:
        return "timeout", "wall clock"
    if result.returncode in _CPU_SIGNALS:
        return "timeout", "cpu time"
    return "crash", f"exit status {result.returncode}"


def run_tests(
    options: SandboxOptions, code: str, tests: str, prefix: str | None = None
) -> tuple[str, str]:
    """Run ``tests`` against ``code`` in a fresh sandbox; ``(reason, detail)``.

    ``prefix`` is the row's prompt, already at the start of ``code``: the tests' process runs it
    too, so the helpers it defines are the row's, not the response's.
    """
    if not tests.strip():
        return "bad_test", "empty"
    # A fresh secret per run, known only to the tests' process: the candidate's process
    # cannot print a verdict it was never told.
    token = secrets.token_hex(16)
    request = {"mode": "test", "token": token, "code": code, "test": tests, "prefix": prefix}
    return judge(run_in_sandbox(options, request), token)


class CodeReward(BaseReward):
    """Execution reward: ``{"score": 1.0 | 0.0, "acc", "reason", "error"}`` per response.

    Example::

        reward = CodeReward()
        reward.score("openai/openai_humaneval",
                     "```python\\ndef add(a, b):\\n    return a + b\\n```",
                     "assert add(2, 3) == 5")
        # -> {"score": 1.0, "acc": True, "reason": "pass", "error": ""}

    Keep ``sandbox.timeout_s`` below ``[reward] timeout_s`` (5 s by default): past that the
    manager stops the call, and the row is counted in ``reward/timeouts`` without a reason.
    """

    @attrs.frozen(kw_only=True)
    class Config(BaseReward.Config):
        """``[reward.options.code]``; the sandbox's limits in ``[reward.options.code.sandbox]``."""

        sandbox: SandboxOptions = attrs.field(factory=SandboxOptions)
        block: Block = key(
            "last",
            "Which fenced Python block of the response is the answer: the last, the "
            "first, or all of them joined.",
            validator=attrs.validators.in_(("last", "first", "all")),
        )

    config: CodeReward.Config

    def score(
        self,
        data_source: str,
        solution_str: str,
        ground_truth: str,
        extra_info: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        code = extract_code(solution_str, self.config.block)
        if code is None:
            reason, detail = "no_code", ""
        else:
            found = (extra_info or {}).get("code_prefix")
            prefix = found if isinstance(found, str) else None
            code = with_prefix(code, prefix)
            reason, detail = run_tests(self.config.sandbox, code, str(ground_truth), prefix)
        passed = reason == "pass"
        return {"score": 1.0 if passed else 0.0, "acc": passed, "reason": reason, "error": detail}
