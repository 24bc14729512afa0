"""exit_origin names the code that called sys.exit, also when a library stands in for it."""

from __future__ import annotations

import sys

from rlcore.workers.termination import exit_origin


def _caught(call):
    try:
        call()
    except SystemExit as exc:
        return exc
    raise AssertionError("no SystemExit")


def _calls_exit():
    sys.exit(3)


def test_the_caller_of_a_plain_sys_exit():
    origin = exit_origin(_caught(_calls_exit))
    assert origin == f"_calls_exit ({__file__}:{_calls_exit.__code__.co_firstlineno + 1})"


class _Hooks:
    """What wandb's service does to the whole process: sys.exit replaced by a method."""

    def __init__(self):
        self._orig = sys.exit

    def exit(self, code=0):
        self._orig(code)


def test_the_caller_when_sys_exit_is_replaced(monkeypatch):
    monkeypatch.setattr(sys, "exit", _Hooks().exit)
    origin = exit_origin(_caught(_calls_exit))
    assert origin == f"_calls_exit ({__file__}:{_calls_exit.__code__.co_firstlineno + 1})"
