"""A local HTTP server that speaks the Anthropic Messages API — the one stand-in
the tests allow: the real `anthropic` SDK talks to it over HTTP (base_url).

`answers` is a list of scripted replies, served in order (the last one
repeats), or a mapping from the forced tool's name to a reply; a reply is a
(status, body) pair, where body is a dict sent as JSON.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def message(content: list[dict], input_tokens: int = 100, output_tokens: int = 20, cached: int = 0) -> dict:
    return {"id": "msg_test", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
            "content": content, "stop_reason": "tool_use", "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens,
                      "cache_read_input_tokens": cached}}


def tool_answer(name: str, data: dict, **usage) -> tuple[int, dict]:
    return 200, message([{"type": "tool_use", "id": "toolu_1", "name": name, "input": data}], **usage)


def text_answer(text: str) -> tuple[int, dict]:
    return 200, message([{"type": "text", "text": text}])


def error(status: int, kind: str = "api_error") -> tuple[int, dict]:
    return status, {"type": "error", "error": {"type": kind, "message": f"scripted {status}"}}


class MessagesServer:
    def __init__(self, answers: list[tuple[int, dict]] | dict[str, tuple[int, dict]]) -> None:
        self.answers, self.requests = answers if isinstance(answers, dict) else list(answers), []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                server.requests.append({"path": self.path, "body": body})
                status, answer = server.reply(body)
                raw = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def reply(self, body: dict) -> tuple[int, dict]:
        if isinstance(self.answers, dict):
            return self.answers[body.get("tool_choice", {}).get("name")]
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
