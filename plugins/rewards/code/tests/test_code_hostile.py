"""Hostile programs through the code reward: each scores 0 with a counted reason and changes
nothing outside its sandbox, and a good solution still scores 1 right after.

Each program is written so that an escape would *pass* its tests: a sandbox that let the
program read the secret, write the file or reach the listener would score it 1, and the test
would fail on the score as well as on the host-side check.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import time
import uuid
from pathlib import Path

import pytest

from rlcore.reward.pool import ScoringPool
from rlcore_code.reward import CodeReward
from rlcore_code.sandbox import NOBODY

GOOD = "```python\ndef add(a, b):\n    return a + b\n```"
GOOD_TESTS = "assert add(2, 3) == 5\n"
SETTLE_S = 30.0  # the kernel reaps a killed sandbox's processes; bounded wait for that


@pytest.fixture(scope="module")
def reward():
    return CodeReward()


def sandbox_processes() -> int:
    """Processes on this host owned by the sandbox's uid (when run as root: 65534)."""
    uid = NOBODY if os.geteuid() == 0 else os.geteuid()
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(FileNotFoundError):  # a process that just ended
                count += entry.stat().st_uid == uid
    return count


def settled(before: int) -> bool:
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        if sandbox_processes() <= before:
            return True
        time.sleep(0.1)
    return False


def run(reward, code: str, tests: str) -> dict:
    result = reward.score("hostile", f"```python\n{code}\n```", tests)
    assert result["score"] == 0.0, result
    # The reward still works: a correct solution right after scores 1.
    assert reward.score("good", GOOD, GOOD_TESTS)["reason"] == "pass"
    return result


def test_fork_bomb(reward):
    if os.geteuid() != 0:
        pytest.skip("the process count is checked for the sandbox's own uid under root")
    before = sandbox_processes()
    code = "import os\n\ndef f():\n    while True:\n        os.fork()\n\nf()"
    result = run(reward, code, "assert True\n")
    assert result["reason"] in {"error", "timeout", "crash"}
    assert settled(before), f"{sandbox_processes()} sandbox processes left, {before} before"


def test_fork_bomb_that_ignores_errors(reward):
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    before = sandbox_processes()
    assert run(reward, code, "assert True\n")["reason"] in {"timeout", "crash"}
    assert settled(before)


def test_infinite_loop(reward):
    assert run(reward, "while True:\n    pass", "assert True\n")["reason"] == "timeout"


def test_sleeping_forever_is_stopped_by_the_wall_clock(reward):
    result = run(reward, "import time\ntime.sleep(3600)", "assert True\n")
    assert (result["reason"], result["error"]) == ("timeout", "wall clock")


def test_ten_gigabyte_allocation(reward):
    result = run(reward, "x = bytearray(10 * 1024**3)\nx[-1] = 1", "assert x[-1] == 1\n")
    assert result["reason"] == "memory"


def test_writing_outside_the_sandbox(reward, tmp_path):
    targets = [Path("/tmp") / f"rlcore-escape-{uuid.uuid4().hex}", tmp_path / "escape.txt"]
    home = Path.home() / f".rlcore-escape-{uuid.uuid4().hex}"
    targets.append(home)
    code = "paths = %r\nfor p in paths:\n    open(p, 'w').write('escaped')" % [
        str(t) for t in targets
    ]
    try:
        result = run(reward, code, "assert all(open(p).read() == 'escaped' for p in paths)\n")
        assert result["reason"] == "error"
        assert result["error"] in {"FileNotFoundError", "PermissionError", "OSError"}
        assert not [t for t in targets if t.exists()]
    finally:
        for t in targets:
            t.unlink(missing_ok=True)


def test_reading_a_file_in_the_users_home(reward):
    secret = uuid.uuid4().hex
    path = Path.home() / f".rlcore-sandbox-secret-{secret[:8]}"
    path.write_text(secret)
    try:
        code = f"def leak():\n    return open({str(path)!r}).read()"
        result = run(reward, code, f"assert leak() == {secret!r}\n")
        assert (result["reason"], result["error"]) == ("error", "FileNotFoundError")
    finally:
        path.unlink()


def test_reading_the_hosts_environment(reward, monkeypatch):
    secret = uuid.uuid4().hex
    monkeypatch.setenv("RLCORE_SANDBOX_SECRET", secret)
    code = (
        "import os\n"
        "def leak():\n"
        "    seen = str(dict(os.environ))\n"
        "    for pid in ('1', 'self', '2'):\n"
        "        try:\n"
        "            seen += open(f'/proc/{pid}/environ', 'rb').read().decode()\n"
        "        except OSError:\n"
        "            pass\n"
        "    return seen"
    )
    # /proc/1 inside is the sandbox's own init (bwrap), whose environment is PATH alone.
    result = run(reward, code, f"assert {secret!r} in leak()\n")
    assert result["reason"] == "fail"


def test_network_connection_to_the_hosts_loopback(reward):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            f"s = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "s.sendall(b'escaped')\n"
            "reached = True"
        )
        result = run(reward, code, "assert reached\n")
        assert (result["reason"], result["error"]) == ("error", "ConnectionRefusedError")
        ready, _, _ = select.select([server], [], [], 0.5)
        assert not ready, "a sandboxed program connected to the host's loopback"


def test_no_network_interface_but_the_sandboxs_own_loopback(reward):
    # Nothing is sent anywhere: the program only lists its interfaces.
    code = "import socket\nnames = [name for _, name in socket.if_nameindex()]"
    assert run(reward, code, "assert names != ['lo'], names\n")["reason"] == "fail"


def test_killing_the_parent(reward):
    code = (
        "import os, signal\n"
        "os.kill(os.getppid(), signal.SIGKILL)\n"
        "os.kill(1, signal.SIGKILL)\n"
        "os._exit(0)"  # and claim success: no verdict, so no pass
    )
    assert run(reward, code, "assert True\n")["reason"] == "crash"


def test_printing_100_megabytes(reward):
    result = run(reward, "import sys\nsys.stdout.write('x' * 100_000_000)", "assert True\n")
    assert result["reason"] == "output_limit"


def test_faking_the_verdict(reward):
    # Printing "pass", exiting 0, or replacing the harness's os functions earns nothing.
    for code in (
        "print('pass')\nimport sys\nsys.exit(0)",
        "import os\nos.write = lambda *a: 0\nos._exit = lambda *a: None\nraise AssertionError",
        "import builtins\nbuiltins.AssertionError = KeyError\nassert False",
    ):
        run(reward, code, "assert True\n")


def test_hostile_programs_in_the_scoring_pool_leave_it_working():
    """Through the reward manager's process pool, two workers: nothing is replaced or lost."""
    hostile = [
        "import os\nwhile True:\n    os.fork()",
        "while True:\n    pass",
        "x = bytearray(10 * 1024**3)",
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos._exit(0)",
        "print('x' * 100_000_000)",
    ]
    tasks = []
    for code in hostile:
        tasks.append((len(tasks), "code", "h", f"```python\n{code}\n```", GOOD_TESTS, None))
        tasks.append((len(tasks), "code", "g", GOOD, GOOD_TESTS, None))
    pool = ScoringPool({"code": CodeReward()}, num_workers=2, timeout_s=60.0)
    try:
        outcomes = pool.run(tasks)
        assert not pool.broken
    finally:
        pool.close()
    statuses = [o[0] for o in outcomes]
    assert statuses == ["ok"] * len(tasks)
    scores = [o[1] for o in outcomes]
    assert scores == [0.0, 1.0] * len(hostile)
    assert [o[2]["reason"] for o in outcomes[1::2]] == ["pass"] * len(hostile)
