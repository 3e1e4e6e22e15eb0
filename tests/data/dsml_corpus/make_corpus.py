"""Regenerate the labelled DSML corpus, from the repository root:
`$VENV/bin/python -m tests.data.dsml_corpus.make_corpus`.

Valid completions are rendered by the formats' own encoders (`deepseek-recipe` for V4 and
V4.1, DeepSeek's V3.2 encoder as SGLang ships it; tests/unit/probe/encoders.py), so
"valid" is DeepSeek's word, not the validator's.  Each corrupt completion is one named edit
of a valid one, and its label is the class that edit was designed to produce (see EDITS);
the validator is not consulted.  Every record carries the request's prompt, so degeneracy
is judged relative to it, except the PROSE_ONLY ones marked `no prompt` (a log without
prompts).  Writes corpus_<format>.jsonl in the `dsv4ctl validate` input format (with
`label` and `edit`).
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
    },
}


def main() -> None:
    for fmt in FORMATS:
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
                rows.append(
                    (
                        f"{fmt}-{label.lower()}-{edit_name}",
                        label,
                        edit_name,
                        edited,
                        SCENARIOS[scenario_name],
                    )
                )
        rng = random.Random(fmt)
        rng.shuffle(rows)
        with open(HERE / f"corpus_{fmt}.jsonl", "w") as out:
            for rid, label, edit_name, text, scenario in rows:
                row = {"id": rid, "label": label, "edit": edit_name, "text": text}
                row["tools"] = scenario.tools
                if scenario.prompt is not None:
                    row["prompt"] = scenario.prompt
                if scenario.echo is not None:
                    row["echo"] = scenario.echo
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(f"corpus_{fmt}.jsonl: {len(rows)} completions")


if __name__ == "__main__":
    main()
