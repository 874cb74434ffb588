"""Dead letters: what a processor could not take, with the original bytes and
Kafka Connect style error headers, so an operator can read why and replay."""

from __future__ import annotations

from schemas import ContractError


def dead_letter_headers(topic: str, partition: int, offset: int, error: Exception,
                        stage: str) -> list[tuple[str, bytes]]:
    field = error.field if isinstance(error, ContractError) else ""
    headers = {
        "__connect.errors.topic": topic,
        "__connect.errors.partition": str(partition),
        "__connect.errors.offset": str(offset),
        "__connect.errors.stage": stage,
        "__connect.errors.exception.class.name": type(error).__name__,
        "__connect.errors.exception.message": str(error)[:1000],
        "reflect.errors.field": field,
    }
    return [(k, v.encode("utf-8", "replace")) for k, v in headers.items()]
