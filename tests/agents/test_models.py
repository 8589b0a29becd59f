"""The scripted model endpoints alone (no agent CLI needed): each API answers a main turn
from the script step the request's tool results select, streaming or not."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from models import COMMIT_MESSAGE, ModelServer, Say, Shell


def _post(server: ModelServer, path: str, body: dict[str, Any]) -> tuple[str, str]:
    request = urllib.request.Request(server.base_url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.headers["Content-Type"], response.read().decode()


def _events(text: str) -> list[Any]:
    return [json.loads(line[6:]) for line in text.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def test_anthropic_tool_use_then_text() -> None:
    with ModelServer([Shell("git status"), Say("finished")]) as server:
        tools = [{"name": "Bash", "input_schema": {}}]
        kind, text = _post(server, "/v1/messages?beta=true",
                           {"stream": True, "tools": tools,
                            "messages": [{"role": "user", "content": "go"}]})
        assert kind == "text/event-stream"
        start = [e for e in _events(text) if e["type"] == "content_block_start"][0]
        assert start["content_block"]["name"] == "Bash"
        partial = [e for e in _events(text) if e["type"] == "content_block_delta"][0]
        assert json.loads(partial["delta"]["partial_json"])["command"] == "git status"
        result = [{"type": "tool_result", "tool_use_id": "t1", "content": "On branch main"}]
        _, text = _post(server, "/v1/messages", {"tools": tools, "messages": [
            {"role": "user", "content": "go"}, {"role": "assistant", "content": []},
            {"role": "user", "content": result}]})
        assert json.loads(text)["content"] == [{"type": "text", "text": "finished"}]
        _, side = _post(server, "/v1/messages", {"messages": [{"role": "user", "content": "t"}]})
        assert json.loads(side)["stop_reason"] == "end_turn"
        _, count = _post(server, "/v1/messages/count_tokens", {"messages": []})
        assert json.loads(count)["input_tokens"] >= 1
        assert server.tool_outputs() == ["On branch main"]
        assert [r.step for r in server.main_requests()] == [0, 1]


def test_responses_call_follows_the_declared_schema() -> None:
    with ModelServer([Shell("ls"), Say("ok")]) as server:
        tools = [{"type": "function", "name": "shell",
                  "parameters": {"properties": {"command": {"type": "array"}}}}]
        _, text = _post(server, "/v1/responses", {"stream": True, "tools": tools, "input": []})
        done = [e for e in _events(text) if e["type"] == "response.output_item.done"][0]["item"]
        assert done["name"] == "shell"
        assert json.loads(done["arguments"]) == {"command": ["bash", "-lc", "ls"]}
        _, text = _post(server, "/v1/responses", {"stream": True, "tools": tools, "input": [
            {"type": "function_call_output", "call_id": done["call_id"], "output": "a.txt"}]})
        assert _events(text)[-1]["type"] == "response.completed"
        message = [e for e in _events(text) if e["type"] == "response.output_item.done"][0]["item"]
        assert message["content"][0]["text"] == "ok"
        assert server.tool_outputs() == ["a.txt"]


def test_chat_completions_reply_and_commit_message() -> None:
    with ModelServer([Say("the edit")]) as server:
        _, text = _post(server, "/v1/chat/completions", {"stream": True, "messages": [
            {"role": "system", "content": "Act as an expert"}, {"role": "user", "content": "x"}]})
        assert "".join(e["choices"][0]["delta"].get("content") or "" for e in _events(text)) == "the edit"
        _, text = _post(server, "/v1/chat/completions", {"messages": [
            {"role": "system", "content": "Write a one-line Git commit message"},
            {"role": "user", "content": "diff"}]})
        assert json.loads(text)["choices"][0]["message"]["content"] == COMMIT_MESSAGE
        assert len(server.main_requests("chat")) == 1


def test_gemini_function_call() -> None:
    with ModelServer([Shell("pwd"), Say("bye")]) as server:
        tools = [{"functionDeclarations": [{"name": "run_shell_command"}]}]
        _, text = _post(server, "/v1beta/models/m:streamGenerateContent?alt=sse",
                        {"contents": [], "tools": tools})
        part = _events(text)[0]["candidates"][0]["content"]["parts"][0]
        assert part["functionCall"]["args"]["command"] == "pwd"
