"""An OpenAI-compatible endpoint in front of a rollout, run inside the rollout's worker.

An agent written against the ``openai`` client (a harness, :mod:`rlcore.agent.harness`) points
its ``base_url`` at :attr:`EndpointServer.base_url` and calls ``/v1/chat/completions`` (with
``tools``) or ``/v1/completions``; every call is answered by the rollout this worker holds
(``BaseRollout.generate_one``, so any rollout plugin serves it) and recorded: the exact prompt
token ids, the completion token ids, their log-probs and the weight version that answered.
Trajectories are assembled from those records (:mod:`rlcore.agent.trajectory`), never from
re-tokenised text.

Each sample gets a session: ``base_url`` ends in ``/s/<session>/v1``, so calls are attributed
without trusting anything the agent sends. What the agent may not choose, it does not:

- the listening socket is bound to 127.0.0.1 (an ephemeral port);
- a per-run API key (``Authorization: Bearer``) is required, compared in constant time (401);
- a request body over ``max_request_bytes`` is refused while it is read (413); a prompt over
  ``max_prompt_tokens`` (400); ``max_tokens`` is capped by ``max_tokens_per_call`` and by what
  is left of the sample's response budget; a generation past ``request_timeout_s`` is
  answered 504; a session past ``max_calls`` (a flooding agent) is answered 429, and a closed
  session (its sample is over) 410;
- sampling is the run's (temperature, top-p): the log-probs a policy loss uses must be the
  ones it was sampled with, so the request's ``temperature`` is ignored.

The assistant message's ``content`` is the model's text verbatim (call markup included) and
``tool_calls`` are parsed from it: an agent that appends the message as it came back makes the
chat template render the same tokens, so the next prompt extends the previous call.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from rlcore.agent.parsers import ToolCallParser
    from rlcore.interfaces import BaseRollout, SamplingParams

log = logging.getLogger(__name__)

__all__ = ["CallRecord", "EndpointLimits", "EndpointServer", "Session"]

_START_TIMEOUT_S = 30.0


@attrs.frozen(kw_only=True)
class EndpointLimits:
    """Bounds of every request (see the module docstring)."""

    request_timeout_s: float = 120.0
    max_tokens_per_call: int = 4096
    max_prompt_tokens: int = 32768
    max_request_bytes: int = 1 << 20
    max_calls: int = 32  # per session (sample)


@attrs.frozen(kw_only=True)
class CallRecord:
    """One answered call: what the model saw and wrote, token for token."""

    session: str
    index: int  # the call's order within its session
    kind: str  # "chat" or "completion"
    prompt_ids: list[int]
    completion_ids: list[int]
    log_probs: list[float] | None
    weight_version: int
    finish_reason: str
    messages: list[dict[str, Any]] | None = None  # chat calls: the request's messages
    tools: list[dict[str, Any]] | None = None
    text: str = ""  # the completion decoded (special tokens skipped)


@attrs.define
class Session:
    """One sample's calls; ``budget``: completion + between-turn tokens it may grow by."""

    sampling: SamplingParams
    budget: int
    calls: list[CallRecord] = attrs.Factory(list)
    refused: dict[str, int] = attrs.Factory(dict)  # status reason -> count
    open: bool = True
    started: int = 0  # calls admitted (answered or in flight)


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason


class _BodyLimit:
    """ASGI middleware: refuse a body over ``limit`` bytes while reading it (413), whatever
    ``Content-Length`` says (a chunked body has none)."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await _send_json(send, 413, _error_body(f"body over {self.limit} bytes"))
                return
        seen = 0

        async def limited() -> Any:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _HTTPError(413, f"body over {self.limit} bytes", "body_too_large")
            return message

        try:
            await self.app(scope, limited, send)
        except _HTTPError as err:
            await _send_json(send, err.status, _error_body(err.message))


def _error_body(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error"}}


async def _send_json(send: Any, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class EndpointServer:
    """The endpoint of one rollout replica; :meth:`start` serves it from a daemon thread.

    ``tokenizer``: the policy's (chat template, decoding); ``parser``: reads tool calls from
    the model's text (``[agent] tool_parser``); ``version``: the weight version answering now.
    """

    def __init__(
        self,
        rollout: BaseRollout,
        tokenizer: Any,
        *,
        parser: ToolCallParser | None = None,
        limits: EndpointLimits | None = None,
        version: Callable[[], int] = lambda: 0,
        model_name: str = "policy",
    ) -> None:
        self.rollout = rollout
        self.tokenizer = tokenizer
        self.parser = parser
        self.limits = limits or EndpointLimits()
        self.version = version
        self.model_name = model_name
        self.api_key = secrets.token_urlsafe(24)  # per run: this process's lifetime
        self.sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def base_url(self, session: str) -> str:
        """What a harness passes to ``openai.OpenAI(base_url=...)`` for ``session``."""
        return f"{self.root_url}/s/{session}/v1"

    def start(self) -> EndpointServer:
        """Bind 127.0.0.1 on an ephemeral port and serve; returns once it accepts calls."""
        if self._thread is not None:
            return self
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(
            self.app(), log_level="warning", access_log=False, lifespan="off",
            timeout_keep_alive=5,
        )  # fmt: skip
        self._server = uvicorn.Server(config)
        server = self._server

        def serve() -> None:
            asyncio.run(server.serve(sockets=[sock]))

        self._thread = threading.Thread(target=serve, name="rlcore-agent-endpoint", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                msg = f"the agent endpoint did not start on 127.0.0.1 within {_START_TIMEOUT_S}s"
                raise RuntimeError(msg)
            time.sleep(0.01)
        log.info("agent endpoint on %s", self.root_url)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._thread = self._server = None

    def open_session(self, sampling: SamplingParams, budget: int) -> str:
        sid = uuid.uuid4().hex
        with self._lock:
            self.sessions[sid] = Session(sampling=sampling, budget=budget)
        return sid

    def close_session(self, sid: str) -> Session:
        """Refuse its later calls (410) and hand over its records."""
        with self._lock:
            session = self.sessions.pop(sid)
            session.open = False
        return session

    # --- the app --------------------------------------------------------------------------

    def app(self) -> Any:
        from fastapi import FastAPI
        from fastapi.responses import JSONResponse

        api = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

        async def handle(request: Any, sid: str, kind: str) -> Any:
            try:
                self._authorize(request.headers.get("authorization", ""))
                try:
                    body = await request.json()
                except ValueError as err:
                    raise _HTTPError(400, f"the body is not JSON: {err}", "bad_json") from err
                if not isinstance(body, dict):
                    raise _HTTPError(400, "the body must be a JSON object", "bad_json")
                session = self._admit(sid)
                try:
                    return JSONResponse(await self._answer(sid, session, kind, body))
                except _HTTPError as err:
                    with self._lock:
                        session.refused[err.reason] = session.refused.get(err.reason, 0) + 1
                    raise
            except _HTTPError as err:
                return JSONResponse(_error_body(err.message), status_code=err.status)

        async def chat(request: Any) -> Any:
            return await handle(request, request.path_params["sid"], "chat")

        async def completions(request: Any) -> Any:
            return await handle(request, request.path_params["sid"], "completion")

        async def models(request: Any) -> Any:
            try:
                self._authorize(request.headers.get("authorization", ""))
            except _HTTPError as err:
                return JSONResponse(_error_body(err.message), status_code=err.status)
            data = [{"id": self.model_name, "object": "model", "owned_by": "rlcore"}]
            return JSONResponse({"object": "list", "data": data})

        # Raw request handlers (FastAPI's add_route): the OpenAI schemas are read by hand
        # below, loosely, as agents send many optional fields.
        api.add_route("/s/{sid}/v1/chat/completions", chat, methods=["POST"])
        api.add_route("/s/{sid}/v1/completions", completions, methods=["POST"])
        api.add_route("/s/{sid}/v1/models", models, methods=["GET"])
        return _BodyLimit(api, self.limits.max_request_bytes)

    def _authorize(self, header: str) -> None:
        given = header.removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), self.api_key.encode()):
            raise _HTTPError(401, "wrong API key", "auth")

    def _admit(self, sid: str) -> Session:
        with self._lock:
            session = self.sessions.get(sid)
            if session is None or not session.open:
                raise _HTTPError(410, "no open session: its sample is over", "closed")
            if session.started >= self.limits.max_calls:
                session.refused["flood"] = session.refused.get("flood", 0) + 1
                raise _HTTPError(429, f"at most {self.limits.max_calls} calls per sample", "flood")
            session.started += 1
            return session

    async def _answer(
        self, sid: str, session: Session, kind: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        if body.get("stream"):
            raise _HTTPError(400, "stream=true is not supported; ask without it", "stream")
        if body.get("n", 1) not in (1, None):
            raise _HTTPError(400, "n must be 1 (one sample per call)", "n")
        messages = tools = None
        if kind == "chat":
            messages, tools = body.get("messages"), body.get("tools")
            if not isinstance(messages, list) or not messages:
                raise _HTTPError(400, "messages must be a non-empty list", "bad_request")
            prompt_ids = self._render(messages, tools)
        else:
            prompt_ids = self._completion_prompt(body.get("prompt"))
        if len(prompt_ids) > self.limits.max_prompt_tokens:
            raise _HTTPError(
                400, f"prompt of {len(prompt_ids)} tokens; at most "
                f"{self.limits.max_prompt_tokens}", "prompt_too_long",
            )  # fmt: skip
        cap = self._cap(session, prompt_ids, body)
        import attrs as _attrs

        sampling = _attrs.evolve(session.sampling, max_new_tokens=cap)
        version = self.version()
        try:
            result = await asyncio.wait_for(
                self.rollout.generate_one(prompt_ids, sampling), self.limits.request_timeout_s
            )
        except TimeoutError as err:
            msg = f"generation past request_timeout_s={self.limits.request_timeout_s}"
            raise _HTTPError(504, msg, "timeout") from err
        tokens = [int(t) for t in result.token_ids][:cap]
        lps = None if result.log_probs is None else [float(x) for x in result.log_probs][:cap]
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        with self._lock:
            if not session.open:  # the sample ended while this call ran: not part of it
                raise _HTTPError(410, "the sample is over", "closed")
            record = CallRecord(
                session=sid, index=len(session.calls), kind=kind, prompt_ids=list(prompt_ids),
                completion_ids=tokens, log_probs=lps, weight_version=version,
                finish_reason=result.finish_reason, messages=messages, tools=tools, text=text,
            )  # fmt: skip
            session.calls.append(record)
        usage = {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(tokens),
            "total_tokens": len(prompt_ids) + len(tokens),
        }
        head = {"id": f"rlcore-{sid[:8]}-{record.index}", "created": int(time.time())}
        if kind == "completion":
            return {
                **head, "object": "text_completion", "model": self.model_name, "usage": usage,
                "choices": [{"index": 0, "text": text, "finish_reason": result.finish_reason,
                             "logprobs": None}],
            }  # fmt: skip
        calls = self._tool_calls(text) if tools else []
        message: dict[str, Any] = {"role": "assistant", "content": text}
        finish: str = result.finish_reason
        if calls:
            message["tool_calls"] = calls
            finish = "tool_calls" if finish == "stop" else finish
        return {
            **head, "object": "chat.completion", "model": self.model_name, "usage": usage,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        }  # fmt: skip

    def _cap(self, session: Session, prompt_ids: Sequence[int], body: dict[str, Any]) -> int:
        """``max_tokens`` bounded by the endpoint and by the sample's response budget (what
        its calls grew the context by since the first prompt)."""
        asked = body.get("max_completion_tokens", body.get("max_tokens"))
        cap = self.limits.max_tokens_per_call
        if asked is not None:
            if not isinstance(asked, int) or asked < 1:
                raise _HTTPError(400, "max_tokens must be a positive integer", "bad_request")
            cap = min(cap, asked)
        with self._lock:
            first = session.calls[0].prompt_ids if session.calls else None
        grown = 0 if first is None else max(0, len(prompt_ids) - len(first))
        left = session.budget - grown
        if left < 1:
            msg = f"the sample's response budget ({session.budget} tokens) is spent"
            raise _HTTPError(400, msg, "budget")
        return min(cap, left)

    def _render(self, messages: list[Any], tools: Any) -> list[int]:
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=tools or None, add_generation_prompt=True, tokenize=False
            )
        except Exception as err:  # the template's own error on these messages: the caller's
            msg = f"the chat template cannot render these messages: {type(err).__name__}: {err}"
            raise _HTTPError(400, msg[:500], "template") from err
        return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)]

    def _completion_prompt(self, prompt: Any) -> list[int]:
        """A string (encoded) or a list of token ids (used as they are: token in)."""
        if isinstance(prompt, str):
            return [int(t) for t in self.tokenizer.encode(prompt, add_special_tokens=False)]
        if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            vocab = len(self.tokenizer)
            if any(t < 0 or t >= vocab for t in prompt):
                raise _HTTPError(400, f"token ids must be in [0, {vocab})", "bad_request")
            return list(prompt)
        raise _HTTPError(400, "prompt must be a string or a list of token ids", "bad_request")

    def _tool_calls(self, text: str) -> list[dict[str, Any]]:
        if self.parser is None:
            return []
        with contextlib.suppress(Exception):  # unreadable calls: the text is the answer
            calls, _errors = self.parser.parse(text)
            return [
                {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                }
                for i, c in enumerate(calls)
            ]
        return []
