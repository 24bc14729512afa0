"""Tool descriptions and tool turns through the tokenizer's own chat template.

A model is trained on its chat template's layout: where the tool descriptions go in the
prompt, how a tool's answer is wrapped, how the next assistant turn opens. Instead of a
hard-coded string per model family, :class:`ChatTemplateTurns` renders them with
``tokenizer.apply_chat_template(messages, tools=...)``:

- the prompt: :func:`tool_schemas` are passed as ``tools`` when the data set is tokenized;
- a tool turn: the template renders ``[user, assistant(SENTINEL), tool...]`` with the
  generation prompt; the text after the assistant's content is what follows the model's turn
  (its end-of-turn marker, unless the model wrote it as its stop token, the tool messages,
  the next assistant header);
- :meth:`ChatTemplateTurns.mismatch`: whether a finished conversation's token ids equal the
  template's rendering of its messages (counted as ``agent/template_mismatches``).

The model's own tokens are never re-encoded; only the text between its turns is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from rlcore.errors import ConfigError

__all__ = ["SENTINEL", "ChatTemplateTurns", "tool_schemas"]

# Text no template rewrites (no whitespace to trim, no reasoning tags, no JSON).
SENTINEL: Final = "RLCORExSENTINELx7f3a"


def tool_schemas(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """The OpenAI-style ``tools`` list chat templates take, from each tool's ``schema()``."""
    return [{"type": "function", "function": dict(t.schema())} for t in tools]


class ChatTemplateTurns:
    """Renders tool turns with ``tokenizer``'s chat template; ``tools``: :func:`tool_schemas`."""

    def __init__(self, tokenizer: Any, tools: Sequence[Mapping[str, Any]] = ()) -> None:
        if not getattr(tokenizer, "chat_template", None):
            msg = (
                "[agent] tool_turns = 'chat_template' needs a tokenizer with a chat template "
                "(model.tokenizer_path); use tool_turns = 'hermes' for Qwen2.5's fixed layout"
            )
            raise ConfigError(msg)
        self.tokenizer = tokenizer
        self.tools = [dict(t) for t in tools] or None
        self._cache: dict[tuple[int, bool], str] = {}

    def render(self, messages: Sequence[Mapping[str, Any]], *, generation_prompt: bool) -> str:
        text: str = self.tokenizer.apply_chat_template(
            list(messages),
            tools=self.tools,
            add_generation_prompt=generation_prompt,
            tokenize=False,
        )
        return text

    def _after(self, text: str, what: str) -> int:
        at = text.find(SENTINEL)
        if at < 0:
            msg = (
                f"the chat template does not render {what} verbatim, so the text around a "
                "tool turn cannot be taken from it; use [agent] tool_turns = 'hermes'"
            )
            raise ConfigError(msg)
        return at + len(SENTINEL)

    def tool_turn(self, results: Sequence[str], *, stop_text: str | None) -> str:
        """The text that follows a model turn whose calls gave ``results``: the rest of the
        model's turn as the template closes it (minus ``stop_text``, the decoded stop token
        the model ended on, when the template writes that first), one ``tool`` message per
        result, and the next assistant header (the generation prompt)."""
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": "?"},
            {"role": "assistant", "content": SENTINEL},
        ]
        messages += [{"role": "tool", "content": r} for r in results]
        text = self.render(messages, generation_prompt=True)
        tail = text[self._after(text, "an assistant message's content") :]
        if stop_text and tail.startswith(stop_text):
            tail = tail[len(stop_text) :]
        return tail

    def response_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Token ids the template gives ``messages`` (the turns after the prompt: assistant
        and tool) after a user turn and the generation prompt."""
        head = self.render([{"role": "user", "content": SENTINEL}], generation_prompt=True)
        opening = head[self._after(head, "a user message's content") :]
        full = self.render(
            [{"role": "user", "content": SENTINEL}, *messages], generation_prompt=False
        )
        rest = full[self._after(full, "a user message's content") :]
        if not rest.startswith(opening):
            return []  # the template opens the first assistant turn differently: a mismatch
        ids = self.tokenizer.encode(rest[len(opening) :], add_special_tokens=False)
        return [int(t) for t in ids]

    def mismatch(
        self, token_ids: Sequence[int], messages: Sequence[Mapping[str, Any]], stop_ids: set[int]
    ) -> bool:
        """Whether ``token_ids`` (a finished conversation's turns) differ from the template's
        rendering of ``messages``. The conversation's final stop token may be the template's
        end marker or absent from it (GLM ends a turn with the next role's token); what the
        template writes after the last turn (a newline) is ignored."""
        ours = list(token_ids)
        if ours and ours[-1] in stop_ids:
            ours = ours[:-1]
        theirs = self.response_ids(messages)
        if theirs[: len(ours)] != ours:
            return True
        left = self.tokenizer.decode(theirs[len(ours) :], skip_special_tokens=True)
        return bool(left.strip())
