"""ClosingStreamingResponse: a StreamingResponse that always closes its body generator.

Starlette leaves an async generator open when the client goes away (even before the first
byte); closing it at once runs the generator's own cleanup (the server aborts the engine
request and frees its blocks, the router closes the replica stream so the replica aborts).
`on_close()` is the hook for anything else to do afterwards.
"""

from __future__ import annotations

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


class ClosingStreamingResponse(StreamingResponse):
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()
            self.on_close()

    def on_close(self) -> None:
        """Called after the body generator is closed, however the response ended."""
