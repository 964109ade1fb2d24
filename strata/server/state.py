"""What the handlers share: the supervisor, the tokenizer and template, the API keys, the counters.

Clients and what they may see of each other
-------------------------------------------
A server without ``--api-key`` serves everyone who can reach it as one client. With keys, each key is
a client of its own (``--api-key`` can be given several times). A request's **scope** is its key plus
the ``prompt_cache_key`` it sends (OpenAI's field; a client that wants its prefixes kept apart from
other clients on the same key sends a secret one, a conversation id for instance).

``cache_prompt`` reuses what the engine's KV cache holds only when the request that wrote it had the
same scope: a prefix that another scope wrote is read again from the start, so that neither
``usage.prompt_tokens_details.cached_tokens`` nor the prompt's timings tell one client anything about
another client's prompt. The last request shown by ``/v1/status`` is shown only to its own key.
"""

from __future__ import annotations

import hmac
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from ..chat_template import ChatTemplate
from ..tokenizer import Tokenizer
from .errors import ApiError
from .metrics import Metrics
from .requests import DEFAULT_MAX_BODY
from .supervisor import Supervisor

__all__ = ["ServerState"]


@dataclass
class ServerState:
    """Everything the handlers share."""

    supervisor: Supervisor
    tokenizer: Tokenizer
    template: ChatTemplate
    model_name: str
    api_keys: tuple[str, ...] = ()  # empty: no key needed
    max_body: int = DEFAULT_MAX_BODY
    metrics: Metrics = field(default_factory=Metrics)
    cache_prompt: bool = False  # the default of the request field cache_prompt
    created: int = field(default_factory=lambda: int(time.time()))
    last_request: dict[str, Any] | None = None
    last_request_client: str = ""

    @property
    def model_path(self) -> str:
        return self.supervisor.model_path

    def authenticate(self, request: Request) -> str:
        """The client a request comes from ("" on a server without keys); raises 401 without a valid key."""
        if not self.api_keys:
            return ""
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(
                401,
                "this server needs an API key: send 'Authorization: Bearer KEY'",
                code="invalid_api_key",
                type_="authentication_error",
            )
        given = token.strip().encode()
        found = ""
        for k, key in enumerate(self.api_keys):
            # every key is compared, so that the time taken does not say which one matched
            if hmac.compare_digest(given, key.encode()):
                found = f"key{k}"
        if not found:
            raise ApiError(
                401,
                "the API key is not valid for this server",
                code="invalid_api_key",
                type_="authentication_error",
            )
        return found

    def record(self, client: str, summary: dict[str, Any]) -> None:
        self.last_request, self.last_request_client = summary, client

    def last_request_for(self, client: str) -> dict[str, Any] | None:
        return self.last_request if client == self.last_request_client else None
