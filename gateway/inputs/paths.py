"""The OpenAI paths the gateway proxies; every other path on the tenant listener is 404."""

from __future__ import annotations

from typing import Final

CHAT: Final = "/v1/chat/completions"
COMPLETIONS: Final = "/v1/completions"
RESPONSES: Final = "/v1/responses"
PROXIED_PATHS: Final = frozenset({CHAT, COMPLETIONS, RESPONSES})
