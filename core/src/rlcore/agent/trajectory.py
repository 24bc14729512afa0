"""Samples from an endpoint session's recorded calls, and the token-faithfulness check.

:func:`segments` chains a session's calls (:class:`~rlcore.agent.endpoint.CallRecord`)
into samples: a call whose prompt ids start with the previous call's prompt + completion ids
(token for token) extends the current sample; any other call (the harness edited, dropped or
re-worded history, or its re-sent text tokenised differently) starts a new one, a *split*
(``agent/splits`` counts the extra samples). Within a sample the loss mask is 1 exactly on the
completion tokens; the prompt, tool output and template text between calls are 0.

Advantages of split samples: every sample of a trajectory is scored from the same final
answer (the reward manager sees the same ``turns``), so under GRPO each gets the trajectory's
outcome advantage; each counts as one member of its prompt's group (a trajectory split in k
is weighted k times in the group's mean and std, as in AReaL's and SkyRL's proxies).

:func:`check_faithfulness` is the ★ check: the sample's recorded ids against the chat
template's rendering of its final messages, re-tokenised (what a framework that re-tokenises
text would have trained on), the first position where they differ, and whether the loss mask
of the assembled row covers exactly the model's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from rlcore.agent.endpoint import CallRecord

__all__ = ["Faithfulness", "Segment", "check_faithfulness", "check_row", "segments"]


@attrs.define
class Segment:
    """Calls whose prompts extend each other: one trained sample."""

    calls: list[CallRecord]

    @property
    def prompt_ids(self) -> list[int]:
        return list(self.calls[0].prompt_ids)

    @property
    def full_ids(self) -> list[int]:
        last = self.calls[-1]
        return [*last.prompt_ids, *last.completion_ids]

    def response(self) -> tuple[list[int], list[int], list[float]]:
        """(ids after the first prompt, loss mask: 1 on completion tokens, log-probs)."""
        full = self.full_ids
        start = len(self.calls[0].prompt_ids)
        mask = [0] * len(full)
        lps = [0.0] * len(full)
        for call in self.calls:
            at = len(call.prompt_ids)
            for j in range(len(call.completion_ids)):
                mask[at + j] = 1
                if call.log_probs is not None and j < len(call.log_probs):
                    lps[at + j] = call.log_probs[j]
        return full[start:], mask[start:], lps[start:]

    @property
    def weight_versions(self) -> list[int]:
        return [c.weight_version for c in self.calls]


def _extends(call: CallRecord, previous: CallRecord) -> bool:
    head = [*previous.prompt_ids, *previous.completion_ids]
    return len(call.prompt_ids) >= len(head) and call.prompt_ids[: len(head)] == head


def segments(calls: Sequence[CallRecord]) -> list[Segment]:
    """The session's calls (in answer order) chained into samples; a split starts a new one."""
    out: list[Segment] = []
    for call in sorted(calls, key=lambda c: c.index):
        if out and _extends(call, out[-1].calls[-1]):
            out[-1].calls.append(call)
        else:
            out.append(Segment(calls=[call]))
    return out


@attrs.frozen(kw_only=True)
class Faithfulness:
    """One sample's check. ``position``: the first index (into the sample's full ids) where
    the re-tokenised rendering differs, None when it matches; ``recorded``/``retokenized``:
    a few ids from there, for the report."""

    mismatch: bool
    position: int | None = None
    recorded: tuple[int, ...] = ()
    retokenized: tuple[int, ...] = ()


def _retokenized(segment: Segment, tokenizer: Any) -> list[int]:
    last = segment.calls[-1]
    if last.kind == "chat" and last.messages is not None:
        messages = [*last.messages, {"role": "assistant", "content": last.text}]
        text = tokenizer.apply_chat_template(
            messages, tools=last.tools or None, add_generation_prompt=False, tokenize=False
        )
    else:  # a raw completion: the prompt and the completion, decoded and encoded again
        text = tokenizer.decode(segment.full_ids, skip_special_tokens=False)
    return [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]


def check_faithfulness(segment: Segment, tokenizer: Any, *, stop_ids: set[int]) -> Faithfulness:
    """Whether the sample's ids equal the chat template's re-tokenised rendering of its final
    messages. What the template writes after the last turn (a newline) is ignored, and a
    final stop token the template does not write (the model's EOS) is allowed."""
    ours = segment.full_ids
    theirs = _retokenized(segment, tokenizer)
    if (
        ours
        and ours[-1] in stop_ids
        and (len(theirs) < len(ours) or theirs[len(ours) - 1] != ours[-1])
    ):
        ours = ours[:-1]
    for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            return Faithfulness(
                mismatch=True, position=i, recorded=tuple(ours[i : i + 4]),
                retokenized=tuple(theirs[i : i + 4]),
            )  # fmt: skip
    if len(theirs) < len(ours):
        return Faithfulness(
            mismatch=True, position=len(theirs), recorded=tuple(ours[len(theirs) :][:4])
        )
    return Faithfulness(mismatch=False)


def check_row(
    segment: Segment,
    response_ids: Sequence[int],
    loss_mask: Sequence[int],
    prompt_ids: Sequence[int],
) -> str | None:
    """Why an assembled row (its un-padded prompt, response and loss mask) is not exactly the
    sample's recorded tokens with the loss on the model's tokens only; None when it is."""
    full = [*prompt_ids, *response_ids]
    if full != segment.full_ids[: len(full)]:
        return "the row's ids differ from the recorded calls'"
    # Over the whole sequence: where the row puts its prompt/response boundary (a long prompt
    # spills into the response, masked) does not move any token.
    expected = [0] * len(segment.calls[0].prompt_ids) + segment.response()[1]
    mask = [0] * len(prompt_ids) + [int(m) for m in loss_mask]
    if mask != expected[: len(mask)]:
        at = next(i for i, (a, b) in enumerate(zip(mask, expected, strict=False)) if a != b)
        return f"the loss mask is {mask[at]} at position {at}, the records say {expected[at]}"
    return None
