"""A local HTTP server that speaks the Anthropic Messages API (POST /v1/messages), for tests.

Each request takes the next scripted reply; when the script is empty, the server plays a simple model
that proposes the first k configs of the prompt's "Feasible configs not measured yet" list.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOOL = "propose_configs"


def tool_reply(proposals) -> dict:
    """A 200 reply whose tool_use input is {"proposals": proposals}."""
    return {"status": 200, "input": {"proposals": proposals}}


def input_reply(tool_input) -> dict:
    """A 200 reply with an arbitrary tool_use input."""
    return {"status": 200, "input": tool_input}


def text_reply(text: str) -> dict:
    """A 200 reply with text and no tool call."""
    return {"status": 200, "text": text}


def error_reply(status: int) -> dict:
    """An API error (429 rate limit, 529 overloaded, 401 ...)."""
    return {"status": status}


def slow_reply(seconds: float) -> dict:
    """Answers (with the default model) only after `seconds`: a client timeout."""
    return {"status": 200, "sleep": seconds}


_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"}


class FakeMessagesAPI:
    """Context manager: `with FakeMessagesAPI([...]) as api: api.url`; api.requests holds the request bodies."""

    def __init__(self, script: list[dict] | None = None):
        self.script = list(script or [])
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self._lock = threading.Lock()

    def __enter__(self):
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                with api._lock:
                    api.requests.append(body)
                    api.headers.append(dict(self.headers))
                    reply = api.script.pop(0) if api.script else {"status": 200}
                if self.path != "/v1/messages":
                    return self._send(404, {"type": "error", "error": {"type": "not_found_error", "message": self.path}})
                if reply.get("sleep"):
                    time.sleep(reply["sleep"])
                status = reply["status"]
                if status != 200:
                    error = {"type": _ERROR_TYPES.get(status, "api_error"), "message": f"scripted {status}"}
                    return self._send(status, {"type": "error", "error": error})
                if "text" in reply:
                    content = [{"type": "text", "text": reply["text"]}]
                else:
                    tool_input = reply["input"] if "input" in reply else {"proposals": default_model(body)}
                    content = [{"type": "text", "text": "Here are my proposals."},
                               {"type": "tool_use", "id": f"toolu_{len(api.requests)}", "name": TOOL, "input": tool_input}]
                self._send(200, {
                    "id": f"msg_{len(api.requests)}", "type": "message", "role": "assistant", "model": body["model"],
                    "content": content, "stop_reason": "tool_use", "stop_sequence": None,
                    "usage": {"input_tokens": 10, "output_tokens": 10},
                })

            def _send(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        return False

    def prompt(self, i: int) -> str:
        """The user message text of request i."""
        return self.requests[i]["messages"][0]["content"]


def default_model(body: dict) -> list[dict]:
    """Proposes the first k configs the prompt lists as feasible and not measured, with a rationale each."""
    k = body["tools"][0]["input_schema"]["properties"]["proposals"]["maxItems"]
    text = body["messages"][0]["content"]
    listed = re.findall(r"^- (\{.*\}) smem \d+$", text, flags=re.M)
    return [{"config": json.loads(c), "rationale": f"fake model: listed feasible config #{i}"} for i, c in enumerate(listed[:k])]
