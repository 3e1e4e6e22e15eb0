"""What the request put in front of the model, for judging an answer relative to it.

Why: whether text is degenerate depends on where it came from.  A value made of one unit
repeated sixty times, or an answer in Arabic and Hebrew, is ordinary when the prompt holds
it and a sign of damage when nothing in the request explains it.  The context is the text
of the prompt messages, the tool schemas and the echo values (added decoded, as the
probes' prompts carry them as JSON with ``\\uXXXX`` escapes).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from dsv4_engine.probe.scripts import scripts_of
from dsv4_engine.probe.tools import Echo


@dataclass(frozen=True)
class RequestContext:
    text: str
    prompt_known: bool
    """True when the prompt itself is part of `text` (the probes, a `dsv4ctl validate`
    record with `prompt`): only then may text the request does not explain count against
    an answer — without the prompt, the answer may be quoting it."""

    @classmethod
    def of(
        cls,
        prompt: str | Sequence[Mapping[str, Any]] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        echo: Echo | None = None,
    ) -> RequestContext:
        """From a prompt (plain text, or OpenAI chat messages), tools and the echo."""
        parts = [prompt] if isinstance(prompt, str) else [_content(m) for m in prompt or ()]
        if tools:
            parts.append(json.dumps(list(tools), ensure_ascii=False))
        if echo is not None:
            parts.append(json.dumps({echo.tool: echo.args}, ensure_ascii=False))
        return cls("\n".join(parts), prompt_known=prompt is not None)

    def explains(self, fragment: str) -> bool:
        return fragment in self.text

    @cached_property
    def scripts(self) -> frozenset[str]:
        return scripts_of(self.text)


def _content(message: Mapping[str, Any]) -> str:
    """The text of one chat message: string content, text parts, and earlier tool calls."""
    content = message.get("content")
    if isinstance(content, list):
        content = "\n".join(
            str(part.get("text", "")) for part in content if isinstance(part, Mapping)
        )
    calls = [json.dumps(c, ensure_ascii=False) for c in message.get("tool_calls") or ()]
    return "\n".join([str(content or ""), *calls])
