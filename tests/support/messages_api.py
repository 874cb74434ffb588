"""A local HTTP server that speaks the Anthropic Messages API — the one stand-in
the tests allow: the real `anthropic` SDK talks to it over HTTP (base_url).

`answers` is a list of scripted replies, served in order (the last one
repeats), a mapping from the forced tool's name to a reply, or a function of
the request body; a reply is a (status, body) pair, where body is a dict sent
as JSON. `delay` seconds pass before each reply (a slow API).
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def message(content: list[dict], input_tokens: int = 100, output_tokens: int = 20, cached: int = 0,
            cache_write: int = 0) -> dict:
    return {"id": "msg_test", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
            "content": content, "stop_reason": "tool_use", "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens,
                      "cache_read_input_tokens": cached, "cache_creation_input_tokens": cache_write}}


def tool_answer(name: str, data: dict, **usage) -> tuple[int, dict]:
    return 200, message([{"type": "tool_use", "id": "toolu_1", "name": name, "input": data}], **usage)


def text_answer(text: str) -> tuple[int, dict]:
    return 200, message([{"type": "text", "text": text}])


def error(status: int, kind: str = "api_error") -> tuple[int, dict]:
    return status, {"type": "error", "error": {"type": kind, "message": f"scripted {status}"}}


def _numbered(tag: str, text: str) -> list[str]:
    block = re.search(rf"<{tag}>\n(.*?)\n</{tag}>", text, re.S)
    return [line.split(". ", 1)[1] for line in block.group(1).split("\n") if ". " in line] if block else []


class OfflineModel:
    """A model that answers from the request alone, as the offline reasoner
    would: the full path (prompt, tool, parsing, judging) with real content.
    Token counts are characters / 4. As the API does, it caches a system
    prompt only from a minimum length on (1,024 tokens here): the first call
    writes the cache, later ones read it."""

    MIN_CACHED = 1024

    def __init__(self, embedder=None) -> None:
        from processors.reasoners import OfflineReasoner

        self.seen: set[str] = set()
        self.offline = OfflineReasoner(embedder)  # v2, with the worker's embedder when given
        self.lock = threading.Lock()  # the server answers each request on its own thread

    def __call__(self, body: dict) -> tuple[int, dict]:
        with self.lock:
            return self._answer(body)

    def _answer(self, body: dict) -> tuple[int, dict]:
        from streams.adapters.anthropic import DAY, IMPORTANCE, found_of

        offline, tool = self.offline, body["tool_choice"]["name"]
        data, system = body["messages"][0]["content"], body["system"][0]["text"]
        statements, questions = _numbered("statements", data), _numbered("questions", data)
        days = [m.group(1) if (m := DAY.match(s)) else None for s in statements]
        dates = days if all(days) else None  # the insight prompts show each statement's day
        if dates:
            statements = [DAY.sub("", s) for s in statements]
        if tool == "record_questions":  # statements carry their importance in front
            weights = [float(m.group(1)) if (m := IMPORTANCE.match(s)) else 0.0 for s in statements]
            statements = [IMPORTANCE.sub("", s) for s in statements]
            answer = {"questions": offline.questions(statements, importance=weights)[0]}
        elif tool == "record_verdict":  # the challenge prompt: belief, its evidence, the newer statements
            belief = re.search(r"<belief>\n(.*?)\n</belief>", data, re.S).group(1)
            verdict = offline.verdict(belief, _numbered("evidence", data), statements)[0]
            answer = {"verdict": verdict.verdict, "citations": list(verdict.cited), "statement": verdict.statement,
                      "reason": verdict.reason}
        elif questions:  # the batched prompt: each question over the statements found for it, as v2 is asked
            answer = {"insights": []}
            for q, line in enumerate(questions, start=1):
                question, found = found_of(line)
                found = found or list(range(1, len(statements) + 1))
                said = offline.insights(question, [statements[k - 1] for k in found],
                                        dates=[dates[k - 1] for k in found] if dates else None)[0]
                answer["insights"] += [{"question": q, "text": i.text, "citations": [found[c - 1] for c in i.citations]}
                                       for i in said]
        else:
            question = data.split("\n", 1)[0].removeprefix("Question: ")
            answer = {"insights": [{"text": i.text, "citations": list(i.citations)}
                                   for i in offline.insights(question, statements, dates=dates)[0]]}
        # The prefix (tools, system prompt) is billed as input like the data.
        prefix, cached = (len(json.dumps(body.get("tools"))) + len(system)) // 4, system in self.seen
        self.seen.add(system)
        if prefix < self.MIN_CACHED:
            data, prefix = json.dumps(body.get("tools")) + system + data, 0
        return tool_answer(tool, answer, input_tokens=len(data) // 4, output_tokens=len(json.dumps(answer)) // 4,
                           cached=prefix if cached else 0, cache_write=0 if cached else prefix)


class StubModel:
    """A stub a score must tell from a result: asked for questions it asks the
    given ones (the planted patterns' descriptions: evidence as good as it
    gets); asked for insights it says one fixed sentence citing the first
    eight statements found for each question. Its verdict is `unrelated`."""

    SENTENCE = "The user keeps a steady working routine with the agent."

    def __init__(self, questions: list[str]) -> None:
        self.asked = list(questions)

    def __call__(self, body: dict) -> tuple[int, dict]:
        from streams.adapters.anthropic import found_of

        tool, data = body["tool_choice"]["name"], body["messages"][0]["content"]
        statements, questions = _numbered("statements", data), _numbered("questions", data)
        if tool == "record_questions":
            answer = {"questions": self.asked}
        elif tool == "record_verdict":
            answer = {"verdict": "unrelated", "citations": [], "statement": "", "reason": "stub"}
        elif questions:
            answer = {"insights": []}
            for q, line in enumerate(questions, start=1):
                found = found_of(line)[1] or list(range(1, len(statements) + 1))
                answer["insights"].append({"question": q, "text": self.SENTENCE, "citations": found[:8]})
        else:
            answer = {"insights": [{"text": self.SENTENCE, "citations": list(range(1, min(8, len(statements)) + 1))}]}
        return tool_answer(tool, answer, input_tokens=len(data) // 4, output_tokens=len(json.dumps(answer)) // 4)


class MessagesServer:
    def __init__(self, answers, delay: float = 0.0) -> None:
        self.answers = answers if isinstance(answers, dict) or callable(answers) else list(answers)
        self.delay, self.requests = delay, []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                server.requests.append({"path": self.path, "body": body})
                time.sleep(server.delay)
                status, answer = server.reply(body)
                raw = json.dumps(answer).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (a timeout test)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def reply(self, body: dict) -> tuple[int, dict]:
        if callable(self.answers):
            return self.answers(body)
        if isinstance(self.answers, dict):
            return self.answers[body.get("tool_choice", {}).get("name")]
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
