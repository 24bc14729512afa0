from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import pytest

from rlcore_math import is_equiv
from rlcore_math.deadline import DeadlineExceeded, call_with_deadline
from rlcore_math.reward import MathReward


def _spin() -> int:
    x = 0
    while True:  # pure Python: interruptible by the alarm, never finishes by itself
        x += 1


def _fail() -> None:
    raise ValueError("boom")


def _in_thread(fn):
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result()


def test_main_thread_deadline_interrupts():
    start = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        call_with_deadline(_spin, 0.2)
    assert time.monotonic() - start < 5.0
    assert call_with_deadline(lambda: 7, 0.2) == 7
    with pytest.raises(ValueError, match="boom"):
        call_with_deadline(_fail, 0.2)


def test_other_thread_deadline_gives_up():
    def run():
        with pytest.raises(DeadlineExceeded):
            call_with_deadline(lambda: time.sleep(3), 0.1)
        with pytest.raises(ValueError, match="boom"):
            call_with_deadline(_fail, 1.0)
        return call_with_deadline(lambda: 7, 1.0)

    assert threading.current_thread() is threading.main_thread()
    assert _in_thread(run) == 7


def test_callers_alarm_is_restored():
    fired = []
    old = signal.signal(signal.SIGALRM, lambda *_: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 30.0)
        assert call_with_deadline(lambda: 1, 0.5) == 1
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 20.0 < remaining <= 30.0
        assert signal.getsignal(signal.SIGALRM) is not None
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        time.sleep(0.3)
        assert fired == [1]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _score_symbolic() -> bool:
    reward = MathReward(MathReward.Config(timeout_s=5.0))
    return reward.score("math", "\\boxed{2\\sqrt{3}}", "\\sqrt{12}")["acc"]


def test_math_verify_from_threads_and_process_pool():
    assert _in_thread(lambda: is_equiv("x^2+2x+1", "(x+1)^2", timeout_s=5.0))
    with ThreadPoolExecutor(2) as pool:
        assert all(pool.map(lambda _: _score_symbolic(), range(4)))
    with ProcessPoolExecutor(1) as pool:
        assert pool.submit(_score_symbolic).result(timeout=60)
