"""The program that runs first inside the sandbox (``python3 -s -c <this file's text>``).

It reads one JSON line from standard input, ``{"token", "mode", "limits", "code", "test"}``,
lowers its own resource limits, closes standard input, and runs the untrusted code.

- ``mode = "test"`` (the reward): ``code`` then ``test`` run in one namespace. The verdict is
  one line ``<token> <reason> <detail>`` written to a copy of standard output taken before the
  code ran. ``pass`` is written only after both ran to the end, so ``exit(0)``, ``os._exit``,
  a killed process or a printed "passed" never reads as a pass: without the token line the
  host scores 0. Processes the code forked never write a verdict.
- ``mode = "run"`` (the interpreter tool): ``code`` runs as ``__main__``; an exception prints
  its traceback to standard error and the exit status is 1.

Standard library only, no imports from rlcore: it runs under the system's Python, which need
not have rlcore installed. The token is a secret only as far as the code does not search this
process's memory for it (it runs in the same interpreter); the sandbox's namespaces and limits
hold either way.
"""

import builtins
import contextlib
import json
import os
import resource
import sys


def _main() -> None:
    # Bound before the untrusted code runs: it may replace any of them.
    write, exit_now, getpid = os.write, os._exit, os.getpid
    request = json.loads(sys.stdin.buffer.readline())
    token, mode = request["token"], request["mode"]
    for name, (soft, hard) in request["limits"].items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    verdict_fd = os.dup(1)
    harness_pid = getpid()

    def verdict(reason: str, detail: str = "") -> None:
        if getpid() != harness_pid:  # a child the code forked: only the harness reports
            exit_now(0)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):  # the code may have closed or replaced it
                stream.flush()
        write(verdict_fd, f"\n{token} {reason} {detail}\n".encode())
        exit_now(0)

    if mode == "run":
        namespace = {"__name__": "__main__", "__builtins__": builtins}
        try:
            exec(compile(request["code"], "<code>", "exec"), namespace)
        except SystemExit as err:
            sys.stdout.flush()
            exit_now(err.code if isinstance(err.code, int) else 1)
        except BaseException as err:  # shown to the model as a traceback
            import traceback

            with contextlib.suppress(BaseException):
                sys.stdout.flush()  # what it printed first comes first
            # From the code's own frame on: the harness's frame means nothing to the model.
            tb = err.__traceback__
            traceback.print_exception(type(err), err, tb.tb_next if tb is not None else None)
            sys.stdout.flush()
            sys.stderr.flush()
            exit_now(1)
        sys.stdout.flush()
        sys.stderr.flush()
        exit_now(0)

    try:
        code = compile(request["code"], "<candidate>", "exec")
    except BaseException as err:  # SyntaxError, but also a too-deep nesting
        verdict("syntax", type(err).__name__)
    try:
        test = compile(request["test"], "<tests>", "exec")
    except BaseException as err:
        verdict("bad_test", type(err).__name__)
    # Not "__main__": a solution's `if __name__ == "__main__":` demo (input(), prints) stays off.
    namespace = {"__name__": "__candidate__", "__builtins__": builtins}
    try:
        exec(code, namespace)
        exec(test, namespace)
    except AssertionError:
        verdict("fail", "AssertionError")
    except MemoryError:
        verdict("memory", "MemoryError")
    except SystemExit:
        verdict("exit", "SystemExit")
    except BaseException as err:  # any other exception is the code's error
        verdict("error", type(err).__name__)
    verdict("pass")


if __name__ == "__main__":  # run by `python -c`; never imported
    _main()
