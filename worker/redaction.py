"""Removing secrets from text before it is stored: API keys never reach the store.

A program that talks to a remote service copies the service's words into
diagnostics (an error body, an exception message), and a diagnostic is
written to the session log, the run result and ``subagents log --json``. A
proxy or a misbehaving endpoint may echo the ``Authorization`` header back;
an HTTP library may quote an illegal header value. ``Redactor`` replaces
every known secret (as given, and with surrounding whitespace stripped) and
anything shaped like a bearer token, an API key or a URL's user and password with ``[redacted]``; a
secret is also looked for as a JSON string carries it (an echo of a key
holding a quote or a backslash in a JSON error body).

What it does *not* guarantee: a secret transformed beyond recognition
(base64-encoded, split across lines) passes. Callers therefore also keep
bodies short and never quote request headers themselves.
Who calls it: ``worker/programs/llm.py`` for every diagnostic it returns, and
(``known``: the secrets alone) for every text the model sends back, which a
proxy echoing the request could fill with the key.
"""

from __future__ import annotations

import json
import re
from typing import Iterable

__all__ = ["REDACTED", "Redactor"]

REDACTED = "[redacted]"

# Token shapes redacted even when the exact key is not known: "Bearer <token>",
# "sk-..." style keys, "api_key: <value>" / "Authorization=<value>" pairs, and the
# user and password of a URL (``http://user:password@proxy/``: an endpoint's URL is
# quoted in the diagnostics that name it).
_SHAPES = re.compile(
    r"(?i)(bearer\s+)[^\s\"',;}]+"
    r"|\bsk-[A-Za-z0-9_\-]{6,}"
    r"|((?:api[_-]?key|authorization|x-api-key)[\"']?\s*[:=]\s*[\"']?)[^\s\"',;}]+"
    r"|(\b[a-z][a-z0-9+.\-]*://)[^/\s@\"']+@"
)


def _shape(match: re.Match[str]) -> str:
    if match.group(3):
        return match.group(3) + REDACTED + "@"
    prefix = match.group(1) or match.group(2) or ""
    return prefix + REDACTED


class Redactor:
    """Replaces known secrets and secret-shaped tokens in text."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        variants = set()
        for secret in secrets:
            if secret:
                for form in {secret, secret.strip()}:
                    if form:
                        variants.add(form)
                        variants.add(json.dumps(form)[1:-1])  # as a JSON body quoting it carries it (``"`` as ``\"``)
        # longest first, so a key containing another key is removed whole
        self._secrets = sorted((v for v in variants if len(v) >= 4), key=len, reverse=True)

    def __call__(self, text: str) -> str:
        return _SHAPES.sub(_shape, self.known(text))

    def known(self, text: str) -> str:
        """Only the known secrets replaced: for what a model wrote, where a key-shaped example (``sk-...``,
        ``api_key: ...``) is the model's own words and stays, and the real key never does."""
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        return text
