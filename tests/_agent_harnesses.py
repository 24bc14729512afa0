"""Harnesses for the endpoint tests: importable by name, so child processes build them too.

Each drives the endpoint with the ``openai`` client, as a user's agent would."""

from __future__ import annotations

import time
from typing import Any

import openai

from rlcore.interfaces import BaseEnvironment, BaseHarness, HarnessResult


def _client(base_url: str, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=30)


class TwoTurns(BaseHarness):
    """A call, a tool answer, a second call; the history sent back as it came."""

    def run(self, task, base_url, api_key):
        client = _client(base_url, api_key)
        messages: list[dict[str, Any]] = list(task.messages)
        first = client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
        messages.append({"role": "assistant", "content": first.choices[0].message.content})
        messages.append({"role": "tool", "content": "42"})
        second = client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
        return HarnessResult(answer=second.choices[0].message.content, reward_inputs={"x": 1})


class EditsHistory(BaseHarness):
    """Re-writes its first turn before the second call: the trajectory splits."""

    def run(self, task, base_url, api_key):
        client = _client(base_url, api_key)
        messages: list[dict[str, Any]] = list(task.messages)
        client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
        messages.append({"role": "assistant", "content": "EDITED"})
        messages.append({"role": "user", "content": "again"})
        out = client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
        return out.choices[0].message.content


class Misbehaves(BaseHarness):
    """Row 0 well, 1 hangs, 2 crashes, 3 returns nothing, 4 floods the endpoint."""

    def run(self, task, base_url, api_key):
        client = _client(base_url, api_key)
        if task.index == 1:
            time.sleep(60)
        if task.index == 2:
            raise ValueError("boom")
        calls = 6 if task.index == 4 else 1
        for _ in range(calls):
            try:
                out = client.completions.create(model="policy", prompt="hi", max_tokens=3)
            except openai.RateLimitError:
                continue
        if task.index == 3:
            return None
        return out.choices[0].text


class Steps(BaseEnvironment):
    """Counts steps; raises at the second when ``task.index`` is odd."""

    def reset(self, task):
        self.task, self.steps = task, 0
        return "go", {}

    def step(self, action):
        self.steps += 1
        if self.steps == 2 and self.task.index % 2:
            raise RuntimeError("broken environment")
        return "ok", 1.0, self.steps >= 2, False, {}


class UsesEnvironment(BaseHarness):
    """Steps its task's environment with each completion until it terminates."""

    def run(self, task, base_url, api_key):
        client = _client(base_url, api_key)
        env = task.environment
        obs, _ = env.reset(task)
        total, done = 0.0, False
        while not done:
            out = client.completions.create(model="policy", prompt=obs, max_tokens=2)
            obs, reward, done, _trunc, _ = env.step(out.choices[0].text)
            total += reward
        return HarnessResult(answer="done", reward_inputs={"env_reward": total})
