"""The paths the gateway proxies (OpenAI's, and vLLM's `/tokenize` and `/detokenize`); every
other path on the tenant listener is 404. Which of them a backend kind serves is its adapter's
`paths`."""

from __future__ import annotations

from typing import Final

CHAT: Final = "/v1/chat/completions"
COMPLETIONS: Final = "/v1/completions"
RESPONSES: Final = "/v1/responses"
EMBEDDINGS: Final = "/v1/embeddings"
TOKENIZE: Final = "/tokenize"  # vLLM's: a prompt (or chat messages) to token ids
DETOKENIZE: Final = "/detokenize"  # vLLM's: token ids to text
PROXIED_PATHS: Final = frozenset({CHAT, COMPLETIONS, RESPONSES, EMBEDDINGS, TOKENIZE, DETOKENIZE})
OPENAI_PATHS: Final = frozenset({CHAT, COMPLETIONS, RESPONSES, EMBEDDINGS})
# Paths that generate text: the detective audit fingerprints their prompts and answers.
GENERATES: Final = frozenset({CHAT, COMPLETIONS, RESPONSES})
# Paths that only run the tokenizer: no prompt reaches a prefix cache, so nothing is scoped.
UNCACHED: Final = frozenset({TOKENIZE, DETOKENIZE})
