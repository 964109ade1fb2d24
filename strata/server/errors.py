"""Errors as the API answers them: OpenAI's body, ``{"error": {"message", "type", "param", "code"}}``.

strata's codes: ``invalid_request`` (400, ``param`` names the field), ``context_length_exceeded`` (400),
``cancelled`` (400), ``invalid_api_key`` (401), ``not_found`` (404), ``method_not_allowed`` (405),
``request_too_large`` (413), ``lend_failed`` (500), ``engine_exited`` (500), ``engine_error`` (500),
``internal_error`` (500), ``engine_start_failed`` (503), ``engine_unresponsive`` (503),
``server_shutting_down`` (503).

A message says what happened in words a client can act on, and nothing about the machine the server
runs on: the model's folder is cut from every engine message (``public_message``) and the engine's
log stays in the server's own output.
"""

from __future__ import annotations

import os
from typing import Any

from starlette.responses import JSONResponse

__all__ = ["ApiError", "bad", "engine_error", "error_response", "json_response", "public_message"]

HEADERS = {"x-strata-server": "1"}


class ApiError(Exception):
    """An error answered with OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str,
        param: str | None = None,
        type_: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type_ or ("invalid_request_error" if status < 500 else "server_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(param: str, message: str) -> ApiError:
    """A 400 for one field of the request."""
    return ApiError(400, f"{param}: {message}", code="invalid_request", param=param)


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(data, status_code=status, headers={**HEADERS, **(headers or {})})


def error_response(e: ApiError) -> JSONResponse:
    return json_response(e.body(), e.status, e.headers)


def public_message(text: str, model_path: str) -> str:
    """``text`` with the model's path written as its file name alone."""
    name = os.path.basename(model_path)
    for p in sorted(
        {model_path, os.path.abspath(model_path), os.path.realpath(model_path)}, key=len, reverse=True
    ):
        if p and p != name:
            text = text.replace(p, name)
    return text


# the codes the supervisor puts on the errors it makes, with their HTTP status
_SUPERVISOR_CODES = {
    "engine_exited": 500,
    "engine_start_failed": 503,
    "engine_unresponsive": 503,
    "server_shutting_down": 503,
    "cancelled": 400,
}
# the engine's exception classes (strata._exceptions), as the worker names them
_ENGINE_ERRORS = {
    "LendError": (500, "lend_failed", None),
    "ContextError": (400, "context_length_exceeded", "messages"),
    "InvalidArgumentError": (400, "invalid_request", None),
}


def engine_error(ev: dict[str, Any], model_path: str) -> ApiError:
    """The API error for an ``error`` event of a job (from the supervisor or the engine)."""
    msg = public_message(str(ev.get("message") or "the engine failed"), model_path)
    code = ev.get("code")
    if code in _SUPERVISOR_CODES:
        return ApiError(_SUPERVISOR_CODES[code], msg, code=str(code))
    status, code, param = _ENGINE_ERRORS.get(str(ev.get("error")), (500, "engine_error", None))
    return ApiError(status, msg, code=code, param=param)
