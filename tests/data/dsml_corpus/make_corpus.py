"""Regenerate the labelled DSML corpus, from the repository root:
`$VENV/bin/python -m tests.data.dsml_corpus.make_corpus`.

Valid completions are rendered by the formats' own encoders (`deepseek-recipe` for V4 and
V4.1, DeepSeek's V3.2 encoder as SGLang ships it; tests/unit/probe/encoders.py), so
"valid" is DeepSeek's word, not the validator's.  Each corrupt completion is one named edit
of a valid one, and its label is the class that edit was designed to produce (see EDITS);
the validator is not consulted.  Every record carries the request's prompt, so degeneracy
is judged relative to it, except the PROSE_ONLY ones marked `no prompt` (a log without
prompts).  Writes corpus_<format>.jsonl in the `dsv4ctl validate` input format (with
`label`, `edit` and, for the shapes of SHAPES, `shape`).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dsv4_engine.probe.dsml import EOS, DsmlFormat
from tests.unit.probe.encoders import render as encode

HERE = Path(__file__).parent
FORMATS = tuple(f.value for f in DsmlFormat)


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
WRITE = fn(
    "write_file", {"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"]
)
ORDER = fn("lookup_order", {"order_id": {"type": "string"}}, ["order_id"], strict=False)

NOTE = fn(
    "store_note",
    {
        "title": {"type": "string"},
        "body": {"type": "string"},
        "langs": {"type": "array", "items": {"type": "string"}},
        "meta": {"type": "object"},
    },
    ["title", "body"],
)
LIMITS = fn(
    "set_limits",
    {
        "max_id": {"type": "integer"},
        "min_id": {"type": "integer"},
        "ratio": {"type": "number"},
        "tiny": {"type": "number"},
        "label": {"type": "string"},
    },
    ["max_id"],
)

ECHO_ARGS = {
    "record_id": "R-7KQ2M9XW4HT3",
    "token": "ZP8RC6NV2GJ5DY4B",
    "count": 480213,
    "urgent": True,
}
ORDER_ARGS = {"order_id": "ORD-55821-XKQ"}
MULTILINGUAL_ARGS = {
    "title": "مرحبا Привет 你好 שלום Γειά Hello 👋🌍",
    "body": "سلام دنیا — Здравствуй, мир — 世界你好 — עולם — Καλημέρα κόσμε — bonjour 🎉\n✓ done",
    "langs": ["العربية", "Русский", "中文", "עברית", "Ελληνικά", "English", "日本語"],
    "meta": {"emoji": "🧪🔬🚀", "mixed": "Δx ≈ 3μs, ΔΔCt, Tシャツ, GPU显存"},
}
LIMITS_ARGS = {
    "max_id": 2**63 - 1,
    "min_id": -(2**53),
    "ratio": 1.7976931348623157e308,
    "tiny": 5e-324,
    "label": '  quotes " and \\ back\\slash, <b>tags</b> & tabs\t  ',
}


def ask(args: dict) -> str:
    return f"Call the tool with exactly these arguments: {json.dumps(args, ensure_ascii=False)}"


BATCH_CITIES = ("Paris", "東京", "Москва", "القاهرة", "Αθήνα", "서울", "Zürich", "Lima")
CSV = "date,requests,errors,p99_ms\n" + "\n".join(
    f"2025-03-{day:02d},{1000 + 37 * day % 211},{day % 3},{120 + day % 7}" for day in range(1, 32)
)
"""Rows alike but for their numbers: what CSV data looks like, and no loop."""
LOG = "\n".join(
    f"2025-03-01T10:{minute:02d}:00Z INFO health check ok (replica {minute % 3})"
    for minute in range(40)
)
"""One message logged forty times, told apart by its timestamp."""
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri")
TABLES = (
    "| day | shift | who |\n| --- | --- | --- |\n"
    + "\n".join(f"| {day} | early | team {i % 2} |" for i, day in enumerate(WEEKDAYS))
    + "\n\nNext week:\n\n| day | shift | who |\n| --- | --- | --- |\n"
    + "\n".join("|     |       |     |" for _ in range(7))
    + "\n\n+------+------+\n| a    | b    |\n+------+------+\n| 1    | 2    |\n+------+------+"
)
"""A markdown table, an empty one to fill in (rows of drawn lines) and an ASCII table."""
LONG_REASONING = "\n".join(
    f"Step {i}: {what}; then check the result before going on."
    for i, what in enumerate(
        (
            "find the city the user names",
            "look up its weather for two days",
            "find the city's time zone",
            "look up the local time there",
            "answer with both in one sentence",
        ),
        start=1,
    )
)
"""A plan whose steps share a frame: repetition with different words, no loop."""
MULTILINGUAL_PROSE = (
    "中文: 你好, 欢迎使用。日本語: こんにちは、ようこそ。русский: Привет, добро пожаловать. "
    "العربية: مرحبا، أهلا وسهلا."
)


@dataclass(frozen=True)
class Scenario:
    tools: list
    calls: list
    prompt: str
    prose: str = ""
    reasoning: str | None = None
    echo: dict | None = None


SCENARIOS: dict[str, Scenario] = {
    "weather": Scenario(
        [WEATHER],
        [("get_weather", {"city": "San Francisco", "days": 3})],
        "What is the weather in San Francisco for the next 3 days?",
        "Let me check the weather.",
    ),
    "echo": Scenario(
        [ECHO],
        [("record_echo", ECHO_ARGS)],
        ask(ECHO_ARGS),
        echo={"tool": "record_echo", "args": ECHO_ARGS},
    ),
    "order": Scenario(
        [ORDER],
        [("lookup_order", ORDER_ARGS)],
        ask(ORDER_ARGS),
        echo={"tool": "lookup_order", "args": ORDER_ARGS},
    ),
    "search": Scenario(
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
        "帮我搜索关于稀疏注意力 (DSA) 的中文论文, 2025 年, 标签 mla 和 dsa。",
        "我来搜索一下相关论文。",
    ),
    "multi": Scenario(
        [WEATHER, TIME],
        [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "Europe/Paris"})],
        "Weather and local time in Paris, please.",
    ),
    "zero_arg": Scenario([PING], [("ping", {})], "Ping the server."),
    "reasoning": Scenario(
        [WEATHER],
        [("get_weather", {"city": "Oslo", "days": 1})],
        "Weather in Oslo tomorrow?",
        reasoning="The user wants Oslo weather; call the tool.",
    ),
    "multilingual": Scenario(
        [NOTE],
        [("store_note", MULTILINGUAL_ARGS)],
        ask(MULTILINGUAL_ARGS),
        echo={"tool": "store_note", "args": MULTILINGUAL_ARGS},
    ),
    "multilingual_no_echo": Scenario(
        [NOTE],
        [("store_note", MULTILINGUAL_ARGS)],
        "Save a note greeting the team in every language we use.",
        "Saving the note: 👋",
    ),
    "limits": Scenario(
        [LIMITS],
        [("set_limits", LIMITS_ARGS)],
        ask(LIMITS_ARGS),
        echo={"tool": "set_limits", "args": LIMITS_ARGS},
    ),
    "batch": Scenario(
        [WEATHER],
        [("get_weather", {"city": city, "days": 3}) for city in BATCH_CITIES],
        "3-day weather for: " + ", ".join(BATCH_CITIES),
        "Checking each city.",
    ),
    "csv_value": Scenario(
        [WRITE],
        [("write_file", {"path": "data/march.csv", "content": CSV})],
        "Save March's daily request counts as data/march.csv (date, requests, errors, p99).",
        "Writing the file.",
    ),
    "log_value": Scenario(
        [WRITE],
        [("write_file", {"path": "logs/replay.log", "content": LOG})],
        "Write a replay log of the health checks to logs/replay.log.",
        "Writing the log.",
    ),
    "table_value": Scenario(
        [NOTE],
        [("store_note", {"title": "Rota", "body": TABLES})],
        "Store a rota note with a table of this week's shifts and an empty one for next week.",
        "Saving the rota.",
    ),
    "long_reasoning": Scenario(
        [WEATHER, TIME],
        [("get_weather", {"city": "Oslo", "days": 2}), ("get_time", {"tz": "Europe/Oslo"})],
        "Weather and local time in Oslo?",
        reasoning=LONG_REASONING,
    ),
    "multilingual_prose": Scenario(
        [NOTE],
        [("store_note", {"title": "多语言", "body": "Привет — مرحبا — 你好 — こんにちは"})],
        "请用中文、日本語、русский 和 العربية 各写一句问候, 然后保存笔记。",
        MULTILINGUAL_PROSE,
    ),
}
# name -> (tools, prose, prompt); None: a log that kept no prompt.
PROSE_ONLY: dict[str, tuple[list, str, str | None]] = {
    "prose": ([WEATHER], "The capital of France is Paris.", "What is the capital of France?"),
    "markdown": (
        [WEATHER],
        "| model | layers |\n|---|---|\n| V4-Flash | 43 |\n| V4-Pro | 61 |\n\nBoth use DSA.",
        "Tabulate the layer counts of V4-Flash and V4-Pro.",
    ),
    "bilingual": (
        [SEARCH],
        "DeepSeek-V4 的 GPU显存 需求取决于 KV cache 大小, 约 80GB。",
        "DeepSeek-V4 需要多少显存?",
    ),
    "translation": (
        [NOTE],
        "Yes: مرحبا, Привет, שלום, Γειά σου and 你好 all mean hello 👋",
        "Are these all 'hello'? مرحبا (Arabic), Привет (Russian), שלום (Hebrew), "
        "Γειά σου (Greek), 你好 (Chinese)",
    ),
    "translation_no_prompt": (
        [NOTE],
        "Hello is مرحبا in Arabic, Привет in Russian, שלום in Hebrew, Γειά σου in Greek, "
        "你好 in Chinese 👋",
        None,
    ),
    "code_and_notation": (
        [WEATHER],
        "Use `Δt = 3μs` and the ΔΔCt method; the loop `for i in range(10): print(i)` prints 0..9.",
        "Explain the qPCR ΔΔCt method with a timing example.",
    ),
}


def render(fmt: str, scenario: Scenario) -> str:
    return encode(
        DsmlFormat(fmt), scenario.tools, scenario.calls, scenario.prose, scenario.reasoning
    )


def env(fmt: str) -> str:
    return DsmlFormat(fmt).envelope if fmt != "v41" else " " + DsmlFormat(fmt).envelope


def sp(fmt: str) -> str:
    return DsmlFormat(fmt).spelling.space


def other_env(fmt: str) -> str:
    return {"v32": "tool_calls", "v4": "function_calls", "v41": " tool_calls"}[fmt]


def cut_at(text: str, needle: str, extra: int = 0) -> str:
    return text[: text.index(needle) + extra]


def first_param_to_json_body(text: str, fmt: str) -> str:
    """The invoke's parameter tags replaced by one JSON object (SGLang's "format 2")."""
    params = re.search(rf"(<{M}{sp(fmt)}parameter.*</{M}{sp(fmt)}parameter>)", text, re.S)
    return text.replace(params[1], '{"city": "San Francisco", "days": 3}')


def instead_of_block(text: str, markup: str) -> str:
    """The DSML block replaced by another model family's tool-call markup."""
    return text[: text.index(f"\n\n<{M}")] + "\n\n" + markup + EOS


def repeat_invokes(text: str, fmt: str, times: int) -> str:
    """The block's invokes, all of them, written `times` times: a decoder stuck in a cycle."""
    invokes = re.search(rf"<{M}{sp(fmt)}invoke.*</{M}{sp(fmt)}invoke>", text, re.S)[0]
    return text.replace(invokes, "\n".join([invokes] * times))


WEATHER_JSON = '{"name": "get_weather", "arguments": {"city": "San Francisco", "days": 3}}'
HERMES = f"<tool_call>\n{WEATHER_JSON}\n</tool_call>"
QWEN3_CODER = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)
LLAMA_FUNCTION = '<function=get_weather>{"city": "San Francisco", "days": 3}</function>'
DEEPSEEK_V3 = (
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
    '```json\n{"city": "San Francisco", "days": 3}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
)
MISTRAL = f"[TOOL_CALLS][{WEATHER_JSON}]"
ANTHROPIC = (
    '<function_calls>\n<invoke name="get_weather">\n<parameter name="city">San Francisco'
    '</parameter>\n<parameter name="days">3</parameter>\n</invoke>\n</function_calls>'
)
LONG_SENTENCE = (
    "I will look up the forecast for San Francisco for the next three days and then report "
    "the temperatures back to you. "
)
"""A unit of 119 characters: three repeats are a loop by the long-unit rule alone."""
REASONING_LOOP = "I should call get_weather for Oslo now. "

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
        "ascii_markup_in_reasoning": (
            "reasoning",
            lambda t, f: t.replace("call the tool", 'call <|DSML|invoke name="get_weather">'),
        ),
        "parameter_after_block": (
            "weather",
            lambda t, f: (
                t.removesuffix(EOS)
                + f'\n<{M}{sp(f)}parameter name="x" string="true">y</{M}{sp(f)}parameter>'
            ),
        ),
        "ascii_fragment_in_prose": (
            "weather",
            lambda t, f: t.replace("Let me check", "Let me |DSML| check"),
        ),
        "hermes_dialect": ("weather", lambda t, f: instead_of_block(t, HERMES)),
        "qwen3_coder_dialect": ("weather", lambda t, f: instead_of_block(t, QWEN3_CODER)),
        "llama_function_dialect": ("weather", lambda t, f: instead_of_block(t, LLAMA_FUNCTION)),
        "deepseek_v3_dialect": ("weather", lambda t, f: instead_of_block(t, DEEPSEEK_V3)),
        "ascii_deepseek_v3_dialect": (
            "weather",
            lambda t, f: instead_of_block(t, DEEPSEEK_V3.replace("｜", "|")),
        ),
        "mistral_dialect": ("weather", lambda t, f: instead_of_block(t, MISTRAL)),
        "dialect_in_reasoning": (
            "reasoning",
            lambda t, f: t.replace("call the tool.", "call the tool.\n" + HERMES),
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
        "attributes_swapped": (
            "weather",
            lambda t, f: t.replace(' name="city" string="true"', ' string="true" name="city"'),
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
        "mid_multilingual_value": ("multilingual", lambda t, f: cut_at(t, "Здравствуй", 6)),
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
        "ascii_bars": ("weather", lambda t, f: t.replace(M, "|DSML|")),
        "lowercase_marker": ("weather", lambda t, f: t.replace(M, "｜dsml｜")),
        "plain_xml": ("weather", lambda t, f: t.replace(M + sp(f), "")),
        "ascii_bars_in_invoke_only": (
            "echo",
            lambda t, f: t.replace(f"<{M}{sp(f)}invoke", f"<|DSML|{sp(f)}invoke"),
        ),
        "element_case": (
            "weather",
            lambda t, f: t.replace(f"{M}{sp(f)}invoke", f"{M}{sp(f)}Invoke"),
        ),
        "json_body": ("weather", first_param_to_json_body),
        "no_newline_between_tags": (
            "weather",
            lambda t, f: t.replace(f"</{M}{sp(f)}parameter>\n<", f"</{M}{sp(f)}parameter><", 1),
        ),
        "no_blank_line_before_block": (
            "weather",
            lambda t, f: t.replace(f"\n\n<{M}{env(f)}>", f"\n<{M}{env(f)}>"),
        ),
        "anthropic_dialect": ("weather", lambda t, f: instead_of_block(t, ANTHROPIC)),
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
        "multilingual_char_changed": ("multilingual", lambda t, f: t.replace("Привет", "Привeт")),
        "emoji_dropped": ("multilingual", lambda t, f: t.replace("👋🌍", "👋")),
        "padding_stripped": ("limits", lambda t, f: t.replace(">  quotes", ">quotes")),
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
        "loop_in_closed_value": (
            "weather",
            lambda t, f: t.replace(">San Francisco<", ">" + "San Francisco " * 8 + "<"),
        ),
        "script_salad": (
            "weather",
            lambda t, f: t.replace(
                "Let me check the weather.", "Lеt me chеck 天气 the wеather пожалуйста Ωραίο."
            ),
        ),
        "foreign_scripts_not_in_request": (
            "weather",
            lambda t, f: t.replace(
                "Let me check the weather.", "Let me check the καιρός weather طقس now."
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
        "runaway_after_block": (
            "weather",
            lambda t, f: t.removesuffix(EOS) + "\nI have called the tool." + EOS,
        ),
        "long_period_loop_in_prose": (
            "weather",
            lambda t, f: t.replace("Let me check the weather.", LONG_SENTENCE * 3),
        ),
        "loop_in_reasoning": (
            "reasoning",
            lambda t, f: t.replace("call the tool.", "call the tool. " + REASONING_LOOP * 6),
        ),
        "long_period_loop_in_reasoning": (
            "reasoning",
            lambda t, f: t.replace("call the tool.", LONG_SENTENCE * 3),
        ),
        "long_period_loop_in_value": (
            "log_value",
            lambda t, f: t.replace(LOG[:200], LOG[:120] * 3 + LOG[120:200]),
        ),
        "invoke_cycle": ("weather", lambda t, f: repeat_invokes(t, f, 3)),
        "invoke_cycle_of_two": ("multi", lambda t, f: repeat_invokes(t, f, 2)),
        "replacement_run_in_prose": (
            "weather",
            lambda t, f: t.replace("check the", "check \ufffd\ufffd\ufffd the"),
        ),
        "replacement_run_in_reasoning": (
            "reasoning",
            lambda t, f: t.replace("Oslo weather", "Oslo \ufffd\ufffd weather"),
        ),
        "replacement_run_in_value": (
            "weather",
            lambda t, f: t.replace(">San Francisco<", ">San Fran\ufffd\ufffdcisco<"),
        ),
        "role_token_in_reasoning": (
            "reasoning",
            lambda t, f: t.replace("Oslo weather;", "Oslo weather;<｜User｜>"),
        ),
        "assistant_token_in_reasoning": (
            "reasoning",
            lambda t, f: t.replace("call the tool.", "call the tool.<｜Assistant｜>Sure"),
        ),
    },
}

SHAPES: dict[str, tuple[str, ...]] = {
    "loop": (
        "loop_in_prose",
        "loop_in_value",
        "loop_in_closed_value",
        "punctuation_run",
        "long_period_loop_in_prose",
        "loop_in_reasoning",
        "long_period_loop_in_reasoning",
        "long_period_loop_in_value",
    ),
    "invoke cycle": ("invoke_cycle", "invoke_cycle_of_two"),
    "U+FFFD run": (
        "replacement_run_in_prose",
        "replacement_run_in_reasoning",
        "replacement_run_in_value",
    ),
    "role token": (
        "stray_special_token",
        "role_token_in_reasoning",
        "assistant_token_in_reasoning",
    ),
    "foreign dialect": (
        "hermes_dialect",
        "qwen3_coder_dialect",
        "llama_function_dialect",
        "deepseek_v3_dialect",
        "ascii_deepseek_v3_dialect",
        "mistral_dialect",
        "dialect_in_reasoning",
        "anthropic_dialect",
    ),
    "repetitive values": ("csv_value", "log_value", "table_value", "markdown", "long_reasoning"),
    "parallel calls": ("batch", "multi"),
    "multilingual": (
        "multilingual",
        "multilingual_no_echo",
        "multilingual_prose",
        "bilingual",
        "search",
        "translation",
        "translation_no_prompt",
    ),
}
"""The production shapes (corrupt) and the false-alarm guards (valid) that `make
bench-validator` reports apart, by edit or scenario name: each record in one is written
with its `shape`."""
SHAPE_OF = {name: shape for shape, names in SHAPES.items() for name in names}


def corpus(fmt: str) -> list[str]:
    """The JSON lines of corpus_<fmt>.jsonl, in their committed order."""
    rows = []
    valid = {}
    for name, scenario in SCENARIOS.items():
        valid[name] = render(fmt, scenario)
        rows.append((f"{fmt}-valid-{name}", "VALID", name, valid[name], scenario))
    for name, (tools, prose, prompt) in PROSE_ONLY.items():
        scenario = Scenario(tools, [], prompt, prose)
        rows.append((f"{fmt}-valid-{name}", "VALID", name, prose + EOS, scenario))
    for label, edits in EDITS.items():
        for edit_name, (scenario_name, edit) in edits.items():
            text = valid[scenario_name]
            edited = edit(text, fmt)
            assert edited != text, f"{fmt} {edit_name}: edit changed nothing"
            rid = f"{fmt}-{label.lower()}-{edit_name}"
            rows.append((rid, label, edit_name, edited, SCENARIOS[scenario_name]))
    random.Random(fmt).shuffle(rows)
    return [_record(*row) for row in rows]


def _record(rid: str, label: str, edit_name: str, text: str, scenario: Scenario) -> str:
    row = {"id": rid, "label": label, "edit": edit_name, "text": text}
    if edit_name in SHAPE_OF:
        row["shape"] = SHAPE_OF[edit_name]
    row["tools"] = scenario.tools
    if scenario.prompt is not None:
        row["prompt"] = scenario.prompt
    if scenario.echo is not None:
        row["echo"] = scenario.echo
    return json.dumps(row, ensure_ascii=False)


def main() -> None:
    for fmt in FORMATS:
        lines = corpus(fmt)
        (HERE / f"corpus_{fmt}.jsonl").write_text("".join(line + "\n" for line in lines))
        print(f"corpus_{fmt}.jsonl: {len(lines)} completions")


if __name__ == "__main__":
    main()
