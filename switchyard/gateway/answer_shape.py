"""The one seam between the relay and the API a request came in by: how its answer is written.

The relay runs every request the same way (budgets, routing, cascade, retries, metering) and
hands what the upstream answered to an `AnswerShape`: a chat completion's own bytes for
`/v1/chat/completions` and `/v1/completions` (`PASS_THROUGH`), or a Responses API object for
`/v1/responses` (`switchyard.gateway.responses_stream.ResponsesShape`, one per request: a stream's
events are numbered), or an Anthropic Message for `/v1/messages`
(`switchyard.gateway.messages_stream.MessagesShape`, whose refusals are Anthropic's errors too).
"""

from __future__ import annotations

from collections.abc import Iterable

from switchyard.core.chat_wire import StreamChunk
from switchyard.core.errors import SwitchyardError, error_body

DONE_EVENT = b"data: [DONE]\n\n"


class AnswerShape:
    """The chat API's shape: the upstream's answer and chunks as they came, errors in-band as
    `data: {"error": ...}`, the stream ended by `data: [DONE]`."""

    def whole(self, data: bytes) -> bytes:
        """A non-stream answer (a chat completion or completion, as JSON)."""
        return data

    def events(self, chunk: StreamChunk) -> Iterable[bytes]:
        """The server-sent events one upstream chunk becomes (usage already shaped by the relay)."""
        return (b"data: " + chunk.data + b"\n\n",)

    def failed(self, exc: SwitchyardError) -> bytes:
        """A stream that fails after its first byte says so in-band."""
        return b"data: " + error_body(exc) + b"\n\n"

    def end(self) -> bytes:
        """The stream's last bytes, whether it completed or failed."""
        return DONE_EVENT

    def refusal(self, exc: SwitchyardError) -> bytes:
        """The body of a request refused before its first byte (sent with the error's status and
        headers): the OpenAI-shaped error."""
        return error_body(exc)

    def refusal_status(self, exc: SwitchyardError) -> int:
        """The status a refusal is sent with."""
        return exc.status_code


PASS_THROUGH = AnswerShape()
