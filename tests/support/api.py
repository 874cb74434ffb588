"""A worker's HTTP API called raw (any method, headers, a chunked body), the
body of one episode, and key pairs for per-user credentials."""

from __future__ import annotations

import http.client
import json

import orjson
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

TOKEN = "test-token-" + "0123456789abcdef" * 2
EPISODE = orjson.dumps({"text": "deploys need a log check", "importance": 0.7, "episode_id": "e1"})


def call(port: int, method: str, path: str, body: bytes | None = None, token: str | None = TOKEN,
         headers: dict[str, str] | None = None, chunked: bool = False) -> tuple[int, dict, bytes]:
    """(status, headers, body) of one request; `chunked` sends the body with no Content-Length."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    sent = {**({"Authorization": f"Bearer {token}"} if token else {}), **(headers or {})}
    try:
        if chunked:
            connection.putrequest(method, path)
            for name, value in {**sent, "Transfer-Encoding": "chunked"}.items():
                connection.putheader(name, value)
            connection.endheaders()
            for start in range(0, len(body), 512):
                piece = body[start:start + 512]
                connection.send(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            connection.send(b"0\r\n\r\n")
        else:
            connection.request(method, path, body=body, headers=sent)
        answer = connection.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        connection.close()


def error_of(raw: bytes) -> dict:
    return json.loads(raw)["error"]


def pem_pair(kind: str, tmp_path, name: str) -> tuple[bytes, str]:
    """(private key PEM, path of the public key PEM) of a fresh RSA or EC P-256 key."""
    private = rsa.generate_private_key(65537, 2048) if kind == "rsa" else ec.generate_private_key(ec.SECP256R1())
    public = tmp_path / f"{name}.pub.pem"
    public.write_bytes(private.public_key().public_bytes(serialization.Encoding.PEM,
                                                         serialization.PublicFormat.SubjectPublicKeyInfo))
    return private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption()), str(public)
