"""Scripted model endpoints on loopback, so the real agent CLIs run offline in tests.

One threaded HTTP server on 127.0.0.1 (a random port) answers, from a SCRIPT:

  Anthropic Messages      POST /v1/messages (and ?beta=true), /v1/messages/count_tokens
                          (Claude Code; streaming SSE or plain JSON, as asked)
  OpenAI Responses        POST /v1/responses (codex exec; streaming SSE)
  OpenAI chat completions POST /v1/chat/completions (aider through litellm; stream or not)
  Gemini                  POST /v1beta/models/<m>:generateContent | :streamGenerateContent
                          | :countTokens (gemini-cli)

A script is a list of steps. `Shell(cmd)` asks the agent to run `cmd` with its shell tool
(Claude: `Bash`; codex: whichever shell tool the request declares in `tools`, its argument
schema read from the request; gemini: `run_shell_command`); `Say(text)` ends the turn with
that text. Which step answers a request is worked out from the request itself: the number
of results of our own tool calls it carries. So retries and repeated requests get the same
answer, and no state is kept between requests. For aider (no tools) `Say(text)` is the
whole reply, e.g. a SEARCH/REPLACE block that aider applies and auto-commits.

Requests that are not the agent's main turn (Claude Code's title and quota requests, the
commit-message request of aider, codex's side calls, ...) get a short text answer; a main
turn is one whose `tools` include the shell tool (aider: any chat completion that is not a
commit-message request).

Every request is recorded (`server.requests`); `server.tool_outputs()` gives what the agent
sent back as the result of each of our tool calls, in order.

Only the standard library is used.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterable, Iterator, Sequence, Union
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Shell:
    """Ask the agent to run `command` with its shell tool."""

    command: str


@dataclass(frozen=True)
class Say:
    """End the turn with `text` (for aider: the whole reply, edits included)."""

    text: str


Step = Union[Shell, Say]


@dataclass
class Request:
    """One request the server received."""

    method: str
    path: str  # without the query string
    query: str
    headers: dict[str, str]
    body: Any  # the parsed JSON body, or the raw text when it is not JSON, None when empty
    api: str  # anthropic | count_tokens | responses | chat | gemini | other
    main: bool = False  # a main turn of the agent (answered from the script)
    step: int | None = None  # the script step it was answered with
    at: float = field(default_factory=time.time)


SIDE_TEXT = "OK"
COMMIT_MESSAGE = "Apply the scripted edit"

# Tool names a codex request may declare for running a command, best first.
CODEX_SHELL_TOOLS = ("shell_command", "shell", "exec_command", "local_shell", "container.exec")
GEMINI_SHELL_TOOL = "run_shell_command"
CLAUDE_SHELL_TOOL = "Bash"


def _uid(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _text_of(content: Any) -> str:
    """The text of an Anthropic/OpenAI content value (a string or a list of blocks)."""
    if isinstance(content, str):
        return content
    out: list[str] = []
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict):
                if isinstance(block.get("text"), str):
                    out.append(block["text"])
                elif "content" in block:
                    out.append(_text_of(block["content"]))
                elif isinstance(block.get("output"), str):
                    out.append(block["output"])
            elif isinstance(block, str):
                out.append(block)
    return "\n".join(out)


class ModelServer:
    """The scripted endpoint. Use as a context manager, or start()/stop()."""

    def __init__(self, script: Sequence[Step] = (), *, model: str = "scripted-model") -> None:
        self.script: list[Step] = list(script)
        self.model = model
        self.requests: list[Request] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- life cycle -------------------------------------------------------------------

    def start(self) -> "ModelServer":
        server = self

        class Handler(_Handler):
            owner = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True,
                                        name="scripted-model")
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> "ModelServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:PORT (Claude's ANTHROPIC_BASE_URL; add /v1 for OpenAI clients)."""
        return f"http://127.0.0.1:{self.port}"

    # -- what tests look at ---------------------------------------------------------------

    def main_requests(self, api: str | None = None) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.main and (api is None or r.api == api)]

    def tool_outputs(self) -> list[str]:
        """What the agent sent back for each of our tool calls (from its latest main turn)."""
        mains = self.main_requests()
        if not mains:
            return []
        last = mains[-1]
        return [text for _, text in _tool_results(last.api, last.body)]

    def summary(self) -> str:
        """One line per request, for assertion messages."""
        with self._lock:
            lines = [f"{r.method} {r.path} api={r.api} main={r.main} step={r.step}"
                     for r in self.requests]
        return "\n".join(lines + [f"ERROR {e}" for e in self.errors])

    # -- answering ------------------------------------------------------------------------

    def record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def step_for(self, done: int) -> Step:
        if done < len(self.script):
            return self.script[done]
        return Say(self.script[-1].text if self.script and isinstance(self.script[-1], Say)
                   else "Done.")


def _tool_results(api: str, body: Any) -> list[tuple[str, str]]:
    """(call id, output text) of every tool result in a request, in order."""
    out: list[tuple[str, str]] = []
    if not isinstance(body, dict):
        return out
    if api == "anthropic":
        for message in body.get("messages") or []:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list):
                for block in content:
                    if isinstance(block, dict) and block.get("type") == "tool_result":
                        out.append((str(block.get("tool_use_id")), _text_of(block.get("content"))))
    elif api == "responses":
        for item in body.get("input") or []:
            if isinstance(item, dict) and item.get("type") in (
                    "function_call_output", "custom_tool_call_output", "local_shell_call_output"):
                output = item.get("output")
                if isinstance(output, dict):  # {"content": ..., "success": ...}
                    output = output.get("content", json.dumps(output))
                elif isinstance(output, list):
                    output = _text_of(output)
                out.append((str(item.get("call_id")), str(output)))
    elif api == "chat":
        for message in body.get("messages") or []:
            if isinstance(message, dict) and message.get("role") == "tool":
                out.append((str(message.get("tool_call_id")), _text_of(message.get("content"))))
    elif api == "gemini":
        for content in body.get("contents") or []:
            for part in (content.get("parts") or []) if isinstance(content, dict) else []:
                if isinstance(part, dict) and "functionResponse" in part:
                    response = part["functionResponse"]
                    out.append((str(response.get("id") or response.get("name")),
                                json.dumps(response.get("response"))))
    return out


def _sse(events: Iterable[tuple[str | None, Any]]) -> Iterator[bytes]:
    for name, data in events:
        head = f"event: {name}\n" if name else ""
        yield f"{head}data: {json.dumps(data)}\n\n".encode()


class _Handler(BaseHTTPRequestHandler):
    owner: ModelServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    # -- plumbing -----------------------------------------------------------------------

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw and self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raw = self._read_chunked()
        if self.headers.get("Content-Encoding", "").lower() == "zstd" and raw:
            return raw.decode("latin-1")  # not decodable with the stdlib; keep it raw
        if self.headers.get("Content-Encoding", "").lower() == "gzip" and raw:
            import gzip
            raw = gzip.decompress(raw)
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode("utf-8", "replace")

    def _read_chunked(self) -> bytes:
        data = b""
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                self.rfile.readline()
                return data
            data += self.rfile.read(size)
            self.rfile.readline()

    def _json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, chunks: Iterable[bytes]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for chunk in chunks:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _classify(self, path: str) -> str:
        if path.endswith("/messages/count_tokens"):
            return "count_tokens"
        if path.endswith("/messages"):
            return "anthropic"
        if path.endswith("/responses"):
            return "responses"
        if path.endswith("/chat/completions"):
            return "chat"
        if re.search(r"/models/[^/]+:(stream)?[gG]enerateContent$|:countTokens$", path):
            return "gemini"
        return "other"

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _handle(self, method: str) -> None:
        parts = urlsplit(self.path)
        body = self._body() if method == "POST" else None
        api = self._classify(parts.path)
        request = Request(method, parts.path, parts.query, dict(self.headers.items()), body, api)
        self.owner.record(request)
        try:
            getattr(self, f"_answer_{api}")(request)
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:  # noqa: BLE001 - report to the test, answer 500
            self.owner.errors.append(f"{method} {self.path}: {exc!r}")
            try:
                self._json(500, {"error": {"type": "api_error", "message": repr(exc)}})
            except OSError:
                pass

    # -- other ----------------------------------------------------------------------------

    def _answer_other(self, request: Request) -> None:
        path = request.path
        if path.endswith("/models") and request.method == "GET":
            model = self.owner.model
            self._json(200, {"object": "list", "data": [{"id": model, "object": "model",
                                                          "type": "model", "display_name": model,
                                                          "created_at": "2026-01-01T00:00:00Z"}],
                             "models": [], "has_more": False})
            return
        if request.method == "GET":
            self._json(200, {})
            return
        self._json(404, {"error": {"type": "not_found_error", "message": f"no route {path}"}})

    # -- Anthropic ------------------------------------------------------------------------

    def _answer_count_tokens(self, request: Request) -> None:
        size = len(json.dumps(request.body)) if request.body is not None else 0
        self._json(200, {"input_tokens": max(1, size // 4)})

    def _answer_anthropic(self, request: Request) -> None:
        body = request.body if isinstance(request.body, dict) else {}
        tools = [t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)]
        request.main = CLAUDE_SHELL_TOOL in tools
        blocks: list[dict[str, Any]]
        if request.main:
            done = len(_tool_results("anthropic", body))
            request.step = done
            step = self.owner.step_for(done)
            if isinstance(step, Shell):
                blocks = [{"type": "tool_use", "id": _uid("toolu"), "name": CLAUDE_SHELL_TOOL,
                           "input": {"command": step.command,
                                     "description": "Run the scripted command"}}]
                stop = "tool_use"
            else:
                blocks, stop = [{"type": "text", "text": step.text}], "end_turn"
        else:
            blocks, stop = [{"type": "text", "text": _side_answer(body)}], "end_turn"
        model = str(body.get("model") or self.owner.model)
        message_id = _uid("msg")
        usage = {"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 0,
                 "cache_read_input_tokens": 0}
        if not body.get("stream"):
            self._json(200, {"id": message_id, "type": "message", "role": "assistant",
                             "model": model, "content": blocks, "stop_reason": stop,
                             "stop_sequence": None, "usage": usage})
            return
        events: list[tuple[str | None, Any]] = [("message_start", {
            "type": "message_start",
            "message": {"id": message_id, "type": "message", "role": "assistant", "model": model,
                        "content": [], "stop_reason": None, "stop_sequence": None,
                        "usage": {**usage, "output_tokens": 1}}})]
        for index, block in enumerate(blocks):
            if block["type"] == "text":
                events += [
                    ("content_block_start", {"type": "content_block_start", "index": index,
                                             "content_block": {"type": "text", "text": ""}}),
                    ("content_block_delta", {"type": "content_block_delta", "index": index,
                                             "delta": {"type": "text_delta",
                                                       "text": block["text"]}}),
                ]
            else:
                events += [
                    ("content_block_start", {"type": "content_block_start", "index": index,
                                             "content_block": {**block, "input": {}}}),
                    ("content_block_delta", {"type": "content_block_delta", "index": index,
                                             "delta": {"type": "input_json_delta",
                                                       "partial_json": json.dumps(block["input"])}}),
                ]
            events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        events += [
            ("message_delta", {"type": "message_delta",
                               "delta": {"stop_reason": stop, "stop_sequence": None},
                               "usage": {"output_tokens": 5}}),
            ("message_stop", {"type": "message_stop"}),
        ]
        self._stream(_sse(events))

    # -- OpenAI Responses (codex) -----------------------------------------------------------

    def _answer_responses(self, request: Request) -> None:
        body = request.body if isinstance(request.body, dict) else {}
        tools = {(t.get("name") or t.get("type")): t for t in body.get("tools") or []
                 if isinstance(t, dict)}
        shell = next((name for name in CODEX_SHELL_TOOLS if name in tools), None)
        request.main = shell is not None
        item: dict[str, Any]
        if request.main:
            done = len(_tool_results("responses", body))
            request.step = done
            step = self.owner.step_for(done)
        else:
            step = Say(SIDE_TEXT)
        if isinstance(step, Shell):
            assert shell is not None
            item = _codex_call(shell, tools[shell], step.command)
        else:
            item = {"type": "message", "role": "assistant", "id": _uid("msg"),
                    "content": [{"type": "output_text", "text": step.text, "annotations": []}]}
        response_id = _uid("resp")
        usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": 15}
        response = {"id": response_id, "object": "response", "model": body.get("model"),
                    "status": "completed", "output": [item], "usage": usage}
        if not body.get("stream", True):
            self._json(200, response)
            return
        events: list[tuple[str | None, Any]] = [
            ("response.created", {"type": "response.created",
                                  "response": {**response, "status": "in_progress", "output": []}}),
            ("response.output_item.added", {"type": "response.output_item.added",
                                            "output_index": 0, "item": item}),
        ]
        if item["type"] == "message":
            events.append(("response.output_text.delta", {
                "type": "response.output_text.delta", "item_id": item["id"], "output_index": 0,
                "content_index": 0, "delta": item["content"][0]["text"]}))
        events += [
            ("response.output_item.done", {"type": "response.output_item.done",
                                           "output_index": 0, "item": item}),
            ("response.completed", {"type": "response.completed", "response": response}),
        ]
        self._stream(_sse(events))

    # -- OpenAI chat completions (aider via litellm) ------------------------------------------

    def _answer_chat(self, request: Request) -> None:
        body = request.body if isinstance(request.body, dict) else {}
        messages = body.get("messages") or []
        system = " ".join(_text_of(m.get("content")) for m in messages
                          if isinstance(m, dict) and m.get("role") == "system")
        tools = [((t.get("function") or {}).get("name")) for t in body.get("tools") or []
                 if isinstance(t, dict)]
        text: str | None = None
        tool_call: dict[str, Any] | None = None
        if "commit message" in system.lower():
            text = COMMIT_MESSAGE
        else:
            request.main = True
            done = (len(_tool_results("chat", body)) if tools else
                    sum(1 for m in messages[:-1] if isinstance(m, dict)
                        and m.get("role") == "assistant" and _text_of(m.get("content"))
                        in {s.text for s in self.owner.script if isinstance(s, Say)}))
            request.step = done
            step = self.owner.step_for(done)
            if isinstance(step, Shell) and tools:
                tool_call = {"id": _uid("call"), "type": "function",
                             "function": {"name": tools[0],
                                          "arguments": json.dumps({"command": step.command})}}
            else:
                text = step.text if isinstance(step, Say) else step.command
        model = body.get("model") or self.owner.model
        created = int(time.time())
        completion_id = _uid("chatcmpl")
        finish = "tool_calls" if tool_call else "stop"
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if tool_call:
                message["tool_calls"] = [tool_call]
            self._json(200, {"id": completion_id, "object": "chat.completion", "created": created,
                             "model": model, "usage": usage,
                             "choices": [{"index": 0, "message": message,
                                          "finish_reason": finish}]})
            return
        base = {"id": completion_id, "object": "chat.completion.chunk", "created": created,
                "model": model}
        delta: dict[str, Any] = {"role": "assistant", "content": text or ""}
        if tool_call:
            delta["tool_calls"] = [{"index": 0, **tool_call}]
        chunks: list[tuple[str | None, Any]] = [
            (None, {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}),
            (None, {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
                    "usage": usage}),
        ]
        self._stream([*_sse(chunks), b"data: [DONE]\n\n"])

    # -- Gemini (gemini-cli) ----------------------------------------------------------------

    def _answer_gemini(self, request: Request) -> None:
        body = request.body if isinstance(request.body, dict) else {}
        if request.path.endswith(":countTokens"):
            self._json(200, {"totalTokens": max(1, len(json.dumps(body)) // 4)})
            return
        declared = {d.get("name") for t in body.get("tools") or [] if isinstance(t, dict)
                    for d in t.get("functionDeclarations") or [] if isinstance(d, dict)}
        request.main = GEMINI_SHELL_TOOL in declared
        if request.main:
            done = len(_tool_results("gemini", body))
            request.step = done
            step = self.owner.step_for(done)
        else:
            step = Say(_side_answer(body))
        if isinstance(step, Shell):
            part: dict[str, Any] = {"functionCall": {"name": GEMINI_SHELL_TOOL, "id": _uid("call"),
                                                     "args": {"command": step.command,
                                                              "description": "scripted"}}}
        else:
            part = {"text": step.text}
        answer = {"candidates": [{"content": {"role": "model", "parts": [part]},
                                  "finishReason": "STOP", "index": 0}],
                  "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5,
                                    "totalTokenCount": 15},
                  "modelVersion": self.owner.model}
        if ":stream" in request.path:
            self._stream(_sse([(None, answer)]))
        else:
            self._json(200, answer)


def _side_answer(body: dict[str, Any]) -> str:
    """A sensible answer to a request that is not a main turn."""
    wanted = json.dumps(body.get("system") or body.get("systemInstruction") or "").lower()
    if "json" in wanted and "title" in wanted:
        return json.dumps({"title": "Scripted task", "isNewTopic": True})
    if "isnewtopic" in wanted:
        return json.dumps({"isNewTopic": False, "title": None})
    return SIDE_TEXT


def _codex_call(name: str, tool: dict[str, Any], command: str) -> dict[str, Any]:
    """A codex tool call running `command`, shaped by the tool's declared schema."""
    call_id = _uid("call")
    if tool.get("type") == "local_shell":
        return {"type": "local_shell_call", "id": _uid("lsh"), "call_id": call_id,
                "status": "completed",
                "action": {"type": "exec", "command": ["bash", "-lc", command]}}
    props = (tool.get("parameters") or {}).get("properties") or {}
    args: dict[str, Any]
    if "cmd" in props:
        args = {"cmd": command}
    elif (props.get("command") or {}).get("type") == "array":
        args = {"command": ["bash", "-lc", command]}
    else:
        args = {"command": command}
    return {"type": "function_call", "id": _uid("fc"), "call_id": call_id, "name": name,
            "arguments": json.dumps(args), "status": "completed"}


__all__ = ["ModelServer", "Request", "Say", "Shell", "Step", "COMMIT_MESSAGE", "SIDE_TEXT"]
