"""The program that runs inside the sandbox (``python3 -s -c <this file's text>``).

Standard library only, no imports from rlcore: it runs under the system's Python, which need
not have rlcore installed. Three roles:

- ``run`` (the interpreter tool; ``"mode": "run"`` in the JSON line it reads on standard
  input): runs ``code`` as ``__main__``; an exception prints its traceback, exit status 1.
- ``test`` (the reward's judge, "the test process"; ``"mode": "test"``): reads ``token``,
  ``limits``, ``code``, ``test``, ``prefix`` and ``source`` (this file's text), starts the
  candidate process, runs the row's tests against it and writes the verdict
  ``<token> <reason> <detail>`` on standard output.
- ``candidate`` (argument ``candidate <read fd> <write fd>``, started by the judge, never by
  the host): runs the response's code and answers the judge's calls over two pipes.

Why two processes
-----------------
A candidate that shares an interpreter with its tests owns that interpreter once it has run:
it can walk frames to the harness (``sys._getframe(1)``), replace builtins, ``AssertionError``
or ``unittest``'s asserts, set a trace function that skips ``assert`` lines, read the test
source or the verdict's token from memory (``gc.get_objects``), or return an object whose
``__eq__`` is always true. No check inside that interpreter can be trusted after the candidate
ran, so the verdict is decided in another one:

- The judge never executes a byte of the candidate's code. It starts the candidate as a fresh
  interpreter (``posix_spawn``: an ``exec``, so nothing of the judge's memory is copied)
  whose only channels to the judge are a request pipe and a reply pipe. Before that it makes
  itself non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``): with every capability dropped, a
  process of the same uid can then neither ptrace it nor open its ``/proc/<pid>/mem``,
  ``environ`` or ``fd/``. The token, the tests and the row's prompt live only in the judge.
- The tests run in the judge, in a namespace of their own. Each name the tests use and do not
  define themselves (``check(add)``'s ``add``; builtins and the prompt's own helpers are the
  judge's) is bound to a proxy: a call sends the arguments as data and gets back data.
- Values cross as tagged JSON (:func:`_encode`), decoded by the judge into ``int``, ``float``,
  ``str``, ``bool``, ``None``, ``list``, ``tuple``, ``dict``, ``set``, ``frozenset``,
  ``bytes`` or ``complex`` and nothing else, so whatever the candidate sends compares as plain
  data. A candidate exception comes back as its type's name and is raised in the judge as that
  builtin type (or a fresh ``Exception`` subclass of the same name).
- Only the judge knows the token; the host scores 0 unless it reads exactly one line with it
  (:func:`rlcore_code.reward.judge`), so a printed verdict, an exit, a killed judge or a
  killed candidate never reads as a pass. The judge kills the candidate before it writes.
- Both processes run under the row's limits: the candidate sets them on itself before it
  compiles the code, the judge once the candidate is started.

What stays out of reach by construction (the candidate's interpreter holds nothing that
decides the verdict): frame walking, patching builtins or assert helpers, trace/audit/atexit/
signal hooks, ``sys.excepthook``, always-equal objects, rewriting or reading the tests,
redefining the prompt's helpers that the tests call, forging the token (the kernel's ptrace
access rules keep it from the candidate). What is detected:
the candidate's process ending before or during the tests (``exit``, ``os._exit``, a signal,
the CPU limit) is seen as end-of-file on its reply pipe; once seen, the run cannot pass even
if a test swallowed the error; a reply that is not valid data, or larger than ``_MAX_REPLY``,
is a crash; the judge killed or stopped is a missing verdict or the host's wall clock; a
second verdict line (a leaked token) is a crash.

The limit of this design: the tests can only call the candidate's functions with data and
look at data (the return value); an argument mutated in place is not seen, and a class or a
generator the candidate returns is an error. HumanEval's 164 problems all fit.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import resource
import sys

# The candidate process starts on every score's path: it imports only what it uses.
if sys.argv[1:2] != ["candidate"]:
    import ast
    import signal
    import time

TYPE_CHECKING = False  # mypy reads the block below; `typing` costs a start-up its import
if TYPE_CHECKING:
    from typing import Any, NoReturn

_MAX_REPLY = 64 * 1024 * 1024  # bytes of one reply line the judge reads at most
_REAP_POLLS = 100  # x 10 ms: a candidate whose reply pipe closed has exited by then
_TAGS = ("tuple", "dict", "set", "frozenset", "bytes", "complex")


# --- values as data ---------------------------------------------------------------------------


def _encode(value: Any) -> Any:
    """``value`` as JSON-able data; ``TypeError`` for anything that is not plain data."""
    if value is None or isinstance(value, bool):
        return value if value is None else bool(value)
    if isinstance(value, int):
        return int.__index__(value)
    if isinstance(value, float):
        return float.__float__(value)  # inf and nan: json writes and reads them
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, tuple):
        return {"tuple": [_encode(v) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[_encode(k), _encode(v)] for k, v in value.items()]}
    if isinstance(value, frozenset):
        return {"frozenset": [_encode(v) for v in value]}
    if isinstance(value, set):
        return {"set": [_encode(v) for v in value]}
    if isinstance(value, bytes | bytearray):
        return {"bytes": bytes(value).hex()}
    if isinstance(value, complex):
        return {"complex": [value.real, value.imag]}
    msg = f"a {type(value).__name__} cannot be passed between the tests and the candidate"
    raise TypeError(msg)


def _decode(data: Any) -> Any:
    """The inverse of :func:`_encode`: plain builtin values only; ``ValueError`` otherwise."""
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is list:
        return [_decode(v) for v in data]
    if type(data) is dict and len(data) == 1:
        ((tag, body),) = data.items()
        if tag == "bytes" and type(body) is str:
            return bytes.fromhex(body)
        numbers = type(body) is list and all(type(v) in (int, float) for v in body)
        if tag == "complex" and numbers and len(body) == 2:
            return complex(body[0], body[1])
        if tag in _TAGS and type(body) is list:
            items = [_decode(v) for v in body]
            if tag == "tuple":
                return tuple(items)
            if tag == "set":
                return set(items)
            if tag == "frozenset":
                return frozenset(items)
            if tag == "dict" and all(type(kv) is list and len(kv) == 2 for kv in items):
                return {k: v for k, v in items}
    msg = "not a value the candidate can send"
    raise ValueError(msg)


def _set_limits(limits: dict[str, list[int]]) -> None:
    for name, (soft, hard) in limits.items():
        resource.setrlimit(getattr(resource, name), (soft, hard))


# --- role "candidate": the response's code, answering the judge --------------------------------


def _candidate_main(read_fd: int, write_fd: int) -> None:
    # Bound before the untrusted code runs: it may replace any of them.
    readline = os.fdopen(read_fd, "rb").readline
    out = os.fdopen(write_fd, "wb")
    write, flush, dumps, loads = out.write, out.flush, json.dumps, json.loads
    encode, decode, exit_now, is_callable = _encode, _decode, os._exit, callable
    module_type = type(os)

    def reply(message: dict[str, Any]) -> None:
        try:
            line = dumps(message)
        except BaseException as err:  # an int past 4300 digits, a recursion too deep
            line = dumps({"raise": type(err).__name__})
        write(line.encode() + b"\n")
        flush()

    def failure(err: BaseException) -> dict[str, Any]:
        return {"raise": type(err).__name__}

    request = loads(readline())
    _set_limits(request["limits"])
    # Not "__main__": a solution's `if __name__ == "__main__":` demo (input(), prints) stays off.
    namespace: dict[str, Any] = {"__name__": "__candidate__", "__builtins__": builtins}
    try:
        code = compile(request["code"], "<candidate>", "exec")
    except BaseException as err:  # SyntaxError, but also a too-deep nesting
        reply({"syntax": type(err).__name__})
        exit_now(0)
    try:
        exec(code, namespace)
    except BaseException as err:
        reply(failure(err))
        exit_now(0)
    reply({"loaded": True})
    while True:
        line = readline()
        if not line:
            exit_now(0)
        request = loads(line)
        try:
            if "names" in request:
                kinds = {}
                for name in request["names"]:
                    if name not in namespace:
                        kinds[name] = ["missing"]
                    elif isinstance(namespace[name], module_type):
                        kinds[name] = ["module"]
                    elif is_callable(namespace[name]):
                        kinds[name] = ["call"]
                    else:
                        kinds[name] = ["value", encode(namespace[name])]
                answer = {"names": kinds}
            else:
                args = [decode(a) for a in request["args"]]
                kwargs = {k: decode(v) for k, v in request["kwargs"].items()}
                answer = {"value": encode(namespace[request["call"]](*args, **kwargs))}
        except BaseException as err:  # the candidate's own error, named for the judge
            answer = failure(err)
        reply(answer)


# --- role "test": the judge ------------------------------------------------------------------


class _CandidateGone(BaseException):
    """The candidate's process ended or broke the protocol: a BaseException, so that a test's
    ``except Exception`` does not swallow it (and ``broken`` remembers it if one does)."""


class _CandidateExit(BaseException):
    """The candidate raised ``SystemExit``."""


def _make_dumpable_never() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE = 4
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def _stub_names(tree: ast.Module) -> set[str]:
    """Functions of the prompt whose body holds only a docstring, imports, ``pass`` or
    ``...``: the signatures the response fills in, so the candidate's and not the prompt's."""
    functions = (n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))
    return {f.name for f in functions if all(_inert(statement) for statement in f.body)}


def _inert(statement: ast.stmt) -> bool:
    if isinstance(statement, ast.Expr):
        return isinstance(statement.value, ast.Constant)
    return isinstance(statement, ast.Pass | ast.Import | ast.ImportFrom)


def _free_names(tree: ast.Module) -> set[str]:
    """Names the tests read and bind nowhere (a generous notion of bound: anywhere at all)."""
    loaded: set[str] = set()
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return loaded - bound


class _Judge:
    """The judge's end of the two pipes to the candidate."""

    def __init__(self, source: str) -> None:
        child_in, to_child = os.pipe()
        from_child, child_out = os.pipe()
        os.set_inheritable(child_in, True)  # the judge's own ends stay close-on-exec
        os.set_inheritable(child_out, True)
        # posix_spawn: a fresh interpreter (exec), so nothing of this process's memory, the
        # token included, is copied into the candidate's.
        self.pid = os.posix_spawn(
            sys.executable,
            [sys.executable, "-s", "-c", source, "candidate", str(child_in), str(child_out)],
            dict(os.environ),
        )
        os.close(child_in)
        os.close(child_out)
        self.write = os.fdopen(to_child, "wb")
        self.read = os.fdopen(from_child, "rb")
        self.broken: tuple[str, str] | None = None
        self.cpu_s = float("inf")

    def start(self, limits: dict[str, list[int]], code: str) -> None:
        """Send the candidate its limits and the response's code, which it then runs."""
        self.cpu_s = limits.get("RLIMIT_CPU", (float("inf"),))[0]
        self.send({"limits": limits, "code": code})

    def send(self, message: dict[str, Any]) -> None:
        try:
            self.write.write(json.dumps(message).encode() + b"\n")
            self.write.flush()
        except OSError:
            pass  # the candidate is gone: its missing reply says so

    def receive(self) -> dict[str, Any]:
        line = self.read.readline(_MAX_REPLY + 1)
        try:
            if not line.endswith(b"\n"):
                raise ValueError("no reply" if not line else "reply too large or cut")
            message = json.loads(line)
            if type(message) is not dict:
                raise ValueError("not a message")
        except ValueError as err:
            self.broken = self.broken or self.how_it_ended(str(err))
            raise _CandidateGone from None
        return message

    def how_it_ended(self, problem: str) -> tuple[str, str]:
        """``(reason, detail)`` once the candidate's process is gone or broke the protocol."""
        ended = None
        if problem == "no reply":  # its reply pipe closed: it is ending; give it a moment
            for _ in range(_REAP_POLLS):
                pid, status, usage = os.wait4(self.pid, os.WNOHANG)
                if pid:
                    ended = status, usage.ru_utime + usage.ru_stime
                    break
                time.sleep(0.01)
        if ended is None:  # alive: it broke the protocol, or closed its pipe and went on
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            return ("crash", f"candidate {problem}")
        status, cpu_s = ended
        if os.WIFSIGNALED(status):
            number = os.WTERMSIG(status)
            # RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL at the hard one a second later;
            # a SIGKILL with CPU time to spare came from the candidate itself.
            if number == signal.SIGXCPU or (number == signal.SIGKILL and cpu_s >= self.cpu_s):
                return ("timeout", "cpu time")
            return ("crash", f"candidate killed by signal {number}")
        return ("crash", f"candidate ended, exit status {os.WEXITSTATUS(status)}")

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.check()
        try:
            message = {
                "call": name,
                "args": [_encode(a) for a in args],
                "kwargs": {k: _encode(v) for k, v in kwargs.items()},
            }
        except TypeError as err:
            raise _BadTest(str(err)) from None
        self.send(message)
        return self.answer(self.receive())

    def answer(self, message: dict[str, Any]) -> Any:
        if "value" in message:
            try:
                return _decode(message["value"])
            except (ValueError, TypeError, RecursionError, MemoryError) as err:
                self.broken = ("crash", f"candidate sent a bad value: {type(err).__name__}")
                raise _CandidateGone from None
        raise _exception(message.get("raise"))

    def check(self) -> None:
        if self.broken is not None:
            raise _CandidateGone


class _BadTest(BaseException):
    """The tests passed the candidate something that is not plain data."""


def _exception(name: Any) -> BaseException:
    """The candidate's exception, raised in the judge by the name of its type."""
    if name == "SystemExit":
        return _CandidateExit()
    if type(name) is not str or not name.isidentifier():
        name = "CandidateError"
    found = getattr(builtins, name, None)
    if isinstance(found, type) and issubclass(found, Exception):
        error: BaseException = found(f"raised by the candidate: {name}")
        return error
    fresh: BaseException = type(name, (Exception,), {})(f"raised by the candidate: {name}")
    return fresh


def _proxy(judge: _Judge, name: str) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        return judge.call(name, args, kwargs)

    call.__name__ = call.__qualname__ = name
    return call


def _test_main(request: dict[str, Any]) -> None:
    token = request["token"]
    verdict_fd = os.dup(1)
    write, exit_now = os.write, os._exit
    judge: _Judge | None = None

    def verdict(reason: str, detail: str = "") -> NoReturn:
        if judge is not None:
            with contextlib.suppress(OSError):
                os.kill(judge.pid, signal.SIGKILL)  # no more output from it after ours
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):  # the tests may have closed it
                stream.flush()
        write(verdict_fd, f"\n{token} {reason} {detail}\n".encode())
        exit_now(0)

    # The candidate's interpreter starts first, while this one gets ready; it runs no code of
    # the response before it gets it, which is after this process is protected.
    try:
        judge = _Judge(request["source"])
    except OSError as err:  # RLIMIT_NPROC, RLIMIT_NOFILE
        verdict("crash", f"cannot start the candidate: {err}")
    try:
        _make_dumpable_never()
    except (OSError, ImportError, AttributeError) as err:
        verdict("crash", f"the test process cannot protect itself: {err}")
    try:
        tests = ast.parse(request["test"], "<tests>")
    except BaseException as err:
        verdict("bad_test", type(err).__name__)
    judge.start(request["limits"], request["code"])
    _set_limits(request["limits"])
    try:
        loaded = judge.receive()
    except _CandidateGone:
        verdict(*(judge.broken or ("crash", "protocol")))
    if "syntax" in loaded:
        verdict("syntax", str(loaded["syntax"]))
    namespace = {"__name__": "__tests__", "__builtins__": builtins}
    own = set()
    if request.get("prefix"):
        # The row's prompt (trusted, like its tests): its helpers are the judge's own, so a
        # response cannot redefine what the tests check with (HumanEval's poly, encode_cyclic).
        with contextlib.suppress(Exception):
            prompt = ast.parse(request["prefix"], "<prompt>")
            exec(compile(prompt, "<prompt>", "exec"), namespace)
            own = set(namespace) - _stub_names(prompt)
    wanted = sorted(_free_names(tests) - set(dir(builtins)) - own)
    try:
        if "loaded" not in loaded:
            raise _exception(loaded.get("raise"))
        judge.send({"names": wanted})
        kinds = judge.receive().get("names")
        if type(kinds) is not dict:
            raise _CandidateGone
        for name in wanted:
            kind = kinds.get(name)
            if kind == ["call"]:
                namespace[name] = _proxy(judge, name)
            elif kind == ["module"]:
                # The same module by the same name, imported here: the judge's own copy.
                with contextlib.suppress(ImportError):
                    namespace[name] = __import__(name)
            elif type(kind) is list and len(kind) == 2 and kind[0] == "value":
                namespace[name] = judge.answer({"value": kind[1]})
        exec(compile(tests, "<tests>", "exec"), namespace)
        judge.check()  # a test that swallowed the candidate's end cannot pass
    except _CandidateGone:
        reason, detail = judge.broken or ("crash", "protocol")
        verdict(reason, detail)
    except _CandidateExit:
        verdict("exit", "SystemExit")
    except _BadTest as err:
        verdict("bad_test", str(err))
    except AssertionError:
        verdict("fail", "AssertionError")
    except MemoryError:
        verdict("memory", "MemoryError")
    except SystemExit:
        verdict("exit", "SystemExit")
    except BaseException as err:  # any other exception is the code's error
        verdict("error", type(err).__name__)
    verdict("pass")


# --- role "run": the interpreter tool --------------------------------------------------------


def _run_main(request: dict[str, Any]) -> None:
    exit_now = os._exit
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


def _main() -> None:
    # Python 3.11's 4300-digit limit on int <-> str guards parsers of untrusted text; here
    # values cross as JSON text, and the judge's CPU limit bounds a huge one anyway.
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)
    if sys.argv[1:2] == ["candidate"]:  # started by the judge, with its two pipes
        _candidate_main(int(sys.argv[2]), int(sys.argv[3]))
        return
    request = json.loads(sys.stdin.buffer.readline())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if request["mode"] == "test":
        _test_main(request)
    else:
        _set_limits(request["limits"])
        _run_main(request)


if __name__ == "__main__":  # run by `python -c`; never imported
    _main()
