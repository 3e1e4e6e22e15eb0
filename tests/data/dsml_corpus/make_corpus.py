"""Regenerate the labelled DSML corpus: `$VENV/bin/python tests/data/dsml_corpus/make_corpus.py`.

Valid completions are rendered by DeepSeek's own encoder (`deepseek-recipe`, V4 and V4.1;
V3.2 is V4 with the `function_calls` envelope, DOMAIN.md §5), so "valid" is DeepSeek's
word, not the validator's.  Each corrupt completion is one named edit of a valid one, and
its label is the class that edit was designed to produce (see EDITS); the validator is not
consulted.  Writes corpus_<format>.jsonl in the `dsv4ctl validate` input format plus
`label` and `edit`.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from pathlib import Path

import deepseek_recipe as dr

HERE = Path(__file__).parent
FORMATS = ("v32", "v4", "v41")
EOS = "<｜end▁of▁sentence｜>"


def fn(name: str, properties: dict, required: list[str], strict: bool = True) -> dict:
    schema = {"type": "object", "properties": properties, "required": required}
    if strict:
        schema["additionalProperties"] = False
    return {
        "type": "function",
        "function": {"name": name, "description": name, "parameters": schema},
    }


WEATHER = fn("get_weather", {"city": {"type": "string"}, "days": {"type": "integer"}}, ["city"])
TIME = fn("get_time", {"tz": {"type": "string"}}, ["tz"])
PING = fn("ping", {}, [])
SEARCH = fn(
    "search",
    {
        "query": {"type": "string"},
        "filters": {
            "type": "object",
            "properties": {"lang": {"enum": ["en", "zh"]}, "year": {"type": "integer"}},
        },
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    ["query"],
)
ECHO = fn(
    "record_echo",
    {
        "record_id": {"type": "string", "pattern": "^R-[A-Z0-9]{12}$"},
        "token": {"type": "string", "minLength": 16, "maxLength": 16},
        "count": {"type": "integer"},
        "urgent": {"type": "boolean"},
    },
    ["record_id", "token", "count", "urgent"],
)
ORDER = fn("lookup_order", {"order_id": {"type": "string"}}, ["order_id"], strict=False)

ECHO_ARGS = {
    "record_id": "R-7KQ2M9XW4HT3",
    "token": "ZP8RC6NV2GJ5DY4B",
    "count": 480213,
    "urgent": True,
}
ORDER_ARGS = {"order_id": "ORD-55821-XKQ"}

# name -> (tools, calls [(tool, args)], prose, reasoning, echo)
SCENARIOS: dict[str, tuple[list, list, str, str | None, dict | None]] = {
    "weather": (
        [WEATHER],
        [("get_weather", {"city": "San Francisco", "days": 3})],
        "Let me check the weather.",
        None,
        None,
    ),
    "echo": (
        [ECHO],
        [("record_echo", ECHO_ARGS)],
        "",
        None,
        {"tool": "record_echo", "args": ECHO_ARGS},
    ),
    "order": (
        [ORDER],
        [("lookup_order", ORDER_ARGS)],
        "",
        None,
        {"tool": "lookup_order", "args": ORDER_ARGS},
    ),
    "search": (
        [SEARCH],
        [
            (
                "search",
                {
                    "query": "稀疏注意力 DSA",
                    "filters": {"lang": "zh", "year": 2025},
                    "tags": ["mla", "dsa"],
                },
            )
        ],
        "我来搜索一下相关论文。",
        None,
        None,
    ),
    "multi": (
        [WEATHER, TIME],
        [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "Europe/Paris"})],
        "",
        None,
        None,
    ),
    "zero_arg": ([PING], [("ping", {})], "", None, None),
    "reasoning": (
        [WEATHER],
        [("get_weather", {"city": "Oslo", "days": 1})],
        "",
        "The user wants Oslo weather; call the tool.",
        None,
    ),
}
PROSE_ONLY = {
    "prose": ([WEATHER], "The capital of France is Paris."),
    "markdown": (
        [WEATHER],
        "| model | layers |\n|---|---|\n| V4-Flash | 43 |\n| V4-Pro | 61 |\n\nBoth use DSA.",
    ),
    "bilingual": ([SEARCH], "DeepSeek-V4 的 GPU显存 需求取决于 KV cache 大小, 约 80GB。"),
}


def render(fmt: str, tools: list, calls: list, prose: str, reasoning: str | None) -> str:
    """The completion DeepSeek's encoder renders for this assistant turn."""
    encoding = dr.DeepseekV41Encoding() if fmt == "v41" else dr.DeepseekV4Encoding()
    definitions = [
        dr.ToolDefinition(t["function"]["name"], "", t["function"]["parameters"]) for t in tools
    ]
    tool_calls = [
        dr.ToolCall(f"c{i}", name, json.dumps(args, ensure_ascii=False))
        for i, (name, args) in enumerate(calls)
    ]
    message = dr.AssistantMessage(prose, reasoning_content=reasoning, tool_calls=tool_calls or None)
    conversation = dr.Conversation(
        [dr.UserMessage("go"), message], tools=definitions, thinking_mode=reasoning is not None
    )
    prompt = encoding.render_conversation(conversation).prompt
    turn = prompt[prompt.rindex("<｜User｜>") :]
    turn = turn[turn.index("<｜Assistant｜>") + len("<｜Assistant｜>") :]
    completion = turn[: turn.index(EOS) + len(EOS)]
    # The prompt ends with <think> (thinking) or </think> (not): the engine emits the rest.
    completion = (
        completion.removeprefix("<think>") if reasoning else completion.removeprefix("</think>")
    )
    if fmt == "v32":
        completion = completion.replace("tool_calls>", "function_calls>")
    return completion


def env(fmt: str) -> str:
    return {"v32": "function_calls", "v4": "tool_calls", "v41": " calls"}[fmt]


def sp(fmt: str) -> str:
    return " " if fmt == "v41" else ""


def other_env(fmt: str) -> str:
    return {"v32": "tool_calls", "v4": "function_calls", "v41": " tool_calls"}[fmt]


def cut_at(text: str, needle: str, extra: int = 0) -> str:
    return text[: text.index(needle) + extra]


Edit = Callable[[str, str], str]
M = "｜DSML｜"
# label -> edit name -> (scenario, edit(text, fmt))
EDITS: dict[str, dict[str, tuple[str, Edit]]] = {
    "LEAKED_MARKUP": {
        "fragment_in_prose": (
            "weather",
            lambda t, f: t.replace("Let me check", f"Let me {M}{sp(f)}invoke check"),
        ),
        "second_block_after": (
            "weather",
            lambda t, f: t.removesuffix(EOS) + "\n\n" + t[t.index(f"<{M}") :],
        ),
        "markup_in_reasoning": (
            "reasoning",
            lambda t, f: t.replace("call the tool", f'call <{M}{sp(f)}invoke name="get_weather">'),
        ),
        "parameter_after_block": (
            "weather",
            lambda t, f: (
                t.removesuffix(EOS)
                + f'\n<{M}{sp(f)}parameter name="x" string="true">y</{M}{sp(f)}parameter>'
            ),
        ),
    },
    "UNBALANCED": {
        "parameter_not_closed": (
            "weather",
            lambda t, f: t.replace(f"3</{M}{sp(f)}parameter>", "3"),
        ),
        "invoke_not_closed": (
            "multi",
            lambda t, f: t.replace(f"</{M}{sp(f)}invoke>\n</{M}{env(f)}>", f"\n</{M}{env(f)}>"),
        ),
        "stray_text_between_invokes": (
            "multi",
            lambda t, f: t.replace(
                f"</{M}{sp(f)}invoke>\n<{M}", f"</{M}{sp(f)}invoke>\nweather done\n<{M}", 1
            ),
        ),
        "parameter_without_string_attr": (
            "weather",
            lambda t, f: t.replace(' name="city" string="true"', ' name="city"'),
        ),
        "extra_invoke_close": (
            "weather",
            lambda t, f: t.replace(
                f"</{M}{sp(f)}invoke>", f"</{M}{sp(f)}invoke>\n</{M}{sp(f)}invoke>"
            ),
        ),
        "empty_envelope": (
            "weather",
            lambda t, f: re.sub(rf"(<{M}{env(f)}>).*(</{M}{env(f)}>)", r"\1\n\2", t, flags=re.S),
        ),
    },
    "TRUNCATED": {
        "mid_value": ("echo", lambda t, f: cut_at(t, "ZP8RC6", 4)),
        "mid_tag": ("weather", lambda t, f: cut_at(t, f'<{M}{sp(f)}parameter name="days"', 9)),
        "before_envelope_close": ("multi", lambda t, f: cut_at(t, f"</{M}{env(f)}>")),
        "partial_marker": ("search", lambda t, f: cut_at(t, f"<{M}", 3)),
        "mid_attribute": ("weather", lambda t, f: cut_at(t, 'name="get_weather', 14)),
    },
    "ENVELOPE_MISMATCH": {
        "other_format_envelope": (
            "weather",
            lambda t, f: t.replace(f"{M}{env(f)}>", f"{M}{other_env(f)}>"),
        ),
        "invoke_spacing": (
            "weather",
            lambda t, f: t.replace(f"{M}{sp(f)}invoke", f"{M}{'' if sp(f) else ' '}invoke"),
        ),
        "bare_invoke": (
            "weather",
            lambda t, f: t.replace(f"<{M}{env(f)}>\n", "").replace(f"\n</{M}{env(f)}>", ""),
        ),
        "closing_other_envelope": (
            "multi",
            lambda t, f: t.replace(f"</{M}{env(f)}>", f"</{M}{other_env(f)}>"),
        ),
    },
    "SCHEMA": {
        "integer_as_string": (
            "weather",
            lambda t, f: t.replace('name="days" string="false"', 'name="days" string="true"'),
        ),
        "missing_required": (
            "weather",
            lambda t, f: re.sub(
                rf'<{M}{sp(f)}parameter name="city".*?</{M}{sp(f)}parameter>\n', "", t
            ),
        ),
        "unknown_tool": (
            "weather",
            lambda t, f: t.replace('name="get_weather"', 'name="get_wether"'),
        ),
        "extra_property": (
            "weather",
            lambda t, f: t.replace(
                f'<{M}{sp(f)}parameter name="days"',
                f'<{M}{sp(f)}parameter name="unit" string="true">C</{M}{sp(f)}parameter>\n<{M}{sp(f)}parameter name="days"',
            ),
        ),
        "non_json_literal": ("echo", lambda t, f: t.replace(">480213<", ">48O213<")),
        "no_call_when_echo_asked": ("echo", lambda t, f: "Sure, I have stored the record." + EOS),
    },
    "ARG_CORRUPTION": {
        "id_char_substituted": ("echo", lambda t, f: t.replace("R-7KQ2M9XW4HT3", "R-7KQ2M9XW4HT8")),
        "count_digit_changed": ("echo", lambda t, f: t.replace(">480213<", ">480218<")),
        "boolean_flipped": ("echo", lambda t, f: t.replace(">true<", ">false<")),
        "id_char_dropped": ("order", lambda t, f: t.replace("ORD-55821-XKQ", "ORD-5821-XKQ")),
        "call_repeated": (
            "order",
            lambda t, f: re.sub(
                rf"(<{M}{sp(f)}invoke.*?</{M}{sp(f)}invoke>)", r"\1\n\1", t, flags=re.S
            ),
        ),
    },
    "DEGENERATE_TEXT": {
        "loop_in_prose": (
            "weather",
            lambda t, f: t.replace(
                "Let me check the weather.",
                "Let me check the weather. " + "I will check the weather now. " * 12,
            ),
        ),
        "loop_in_value": ("echo", lambda t, f: cut_at(t, "ZP8RC6") + "ZP8RC6" * 40),
        "script_salad": (
            "weather",
            lambda t, f: t.replace(
                "Let me check the weather.", "Lеt me chеck 天气 the wеather пожалуйста Ωραίο."
            ),
        ),
        "empty": ("weather", lambda t, f: ""),
        "stray_special_token": (
            "weather",
            lambda t, f: t.replace("Let me check", "Let me <｜Assistant｜> check"),
        ),
        "punctuation_run": (
            "weather",
            lambda t, f: t.replace("the weather.", "the weather" + "!?" * 40),
        ),
    },
}


def main() -> None:
    for fmt in FORMATS:
        rows = []
        valid = {}
        for name, (tools, calls, prose, reasoning, echo) in SCENARIOS.items():
            valid[name] = (render(fmt, tools, calls, prose, reasoning), tools, echo)
            rows.append((f"{fmt}-valid-{name}", "VALID", name, *valid[name]))
        for name, (tools, prose) in PROSE_ONLY.items():
            rows.append((f"{fmt}-valid-{name}", "VALID", name, prose + EOS, tools, None))
        for label, edits in EDITS.items():
            for edit_name, (scenario, edit) in edits.items():
                text, tools, echo = valid[scenario]
                edited = edit(text, fmt)
                assert edited != text, f"{fmt} {edit_name}: edit changed nothing"
                rows.append(
                    (f"{fmt}-{label.lower()}-{edit_name}", label, edit_name, edited, tools, echo)
                )
        rng = random.Random(fmt)
        rng.shuffle(rows)
        with open(HERE / f"corpus_{fmt}.jsonl", "w") as out:
            for rid, label, edit_name, text, tools, echo in rows:
                row = {"id": rid, "label": label, "edit": edit_name, "text": text, "tools": tools}
                if echo is not None:
                    row["echo"] = echo
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(f"corpus_{fmt}.jsonl: {len(rows)} completions")


if __name__ == "__main__":
    main()
