"""Handlers for the observability test of `reliable consume`: what a message's body says
decides the handler's outcome, so the test knows how many of each to expect."""

from __future__ import annotations

from reliable import Discard, ReceivedMessage, handler


@handler(
    "obs-consume",
    group="obs-consume-g",
    consume_from="first",
    retry_on=(ConnectionError,),
    dead_letter_other=True,
)
def decide(message: ReceivedMessage) -> None:
    body = bytes(message.body)
    if body.startswith(b"retry") and message.delivery_attempt == 1:
        raise ConnectionError("the downstream service is not answering")  # an expected retry
    if body.startswith(b"dead"):
        raise ValueError("not a valid order")  # dead-lettered at once (dead_letter_other)
    if body.startswith(b"discard"):
        raise Discard("order cancelled")
