"""Chat prompts in DeepSeek-V4's format, rendered by DeepSeek's own `deepseek-recipe`.

SGLang routes V4 chat requests through the same package, so the reference engine sees
the byte-for-byte prompt a real V4 deployment would (system text, tool schemas, DSML
history of earlier calls, tool results).  Only the rendering is used: the token ids come
from the reference engine's byte-level tokenizer.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import deepseek_recipe

from dsv4_engine.reference import tokenizer

RECIPE_MODEL = "DeepSeek-V4-Pro"
_SPECIALS = deepseek_recipe.SpecialTokens(image="<｜deepseek_image｜>")
_OPTIONS = deepseek_recipe.ConversionOptions().with_special_tokens(_SPECIALS)
_ENCODING = deepseek_recipe.DeepseekV4Encoding().with_special_tokens(_SPECIALS)


class ChatRequestError(ValueError):
    """The messages or tools of a request cannot be rendered (a client error: HTTP 400)."""


def _normalized(body: dict[str, Any]) -> dict[str, Any]:
    """The request as recipe's Chat Completions adapter expects it (as SGLang does)."""
    request: dict[str, Any] = {
        "model": RECIPE_MODEL,
        "messages": copy.deepcopy(body["messages"]),
        "thinking": {"type": "enabled" if body.get("thinking") else "disabled"},
    }
    if body.get("tools") and body.get("tool_choice") != "none":
        request["tools"] = body["tools"]
        request["tool_choice"] = "auto"
    for message in request["messages"]:
        if message.get("role") == "developer":
            message["role"] = "system"
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            if "arguments" in function and not isinstance(function["arguments"], str):
                function["arguments"] = json.dumps(function["arguments"], ensure_ascii=False)
    return request


def render(body: dict[str, Any]) -> tuple[str, list[tuple[int, int]]]:
    """(prompt text, special-token ranges) of a chat request body."""
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise ChatRequestError("messages: expected a non-empty list")
    try:
        converted = deepseek_recipe.ChatCompletionRequest(_normalized(body)).convert(_OPTIONS)
        rendered = _ENCODING.render_conversation(converted.conversation)
    except deepseek_recipe.ConversionError as err:
        raise ChatRequestError(f"messages: {_error_message(err)}") from None
    except (TypeError, ValueError, KeyError) as err:
        raise ChatRequestError(f"messages: {err}") from None
    return rendered.prompt, list(rendered.special_ranges)


def prompt_ids(body: dict[str, Any]) -> list[int]:
    text, specials = render(body)
    return tokenizer.encode(text, specials)


def _error_message(err: Exception) -> str:
    body = getattr(err, "body", None)
    try:
        return json.loads(body)["error"]["message"]
    except (TypeError, ValueError, KeyError):
        return str(body or err)
