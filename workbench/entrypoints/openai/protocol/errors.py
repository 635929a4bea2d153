"""The OpenAI-style error: `{"error": {"message", "type", "param", "code"}}` (vLLM's current
shape), where `code` is the HTTP status and `param` the request field at fault.

Raised anywhere a request is handled (parsing, tokenizing, the engine, the router) and turned
into that body by the app's exception handler, or into one SSE event mid-stream.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class APIError(Exception):
    """An error answered as `{"error": {...}}` with `status`; `param` names the bad field."""

    _TYPES = {
        400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
        413: "RequestTooLargeError", 500: "InternalServerError", 503: "ServiceUnavailableError",
    }

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param

    def body(self) -> dict[str, Any]:
        return {"error": {
            "message": self.message, "type": self._TYPES.get(self.status, "APIError"),
            "param": self.param, "code": self.status,
        }}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: int


class ErrorResponse(BaseModel):
    """Every error: `code` is the HTTP status, `param` the request field at fault."""

    error: ErrorDetail
