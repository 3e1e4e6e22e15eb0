"""Real-looking tool-call conversations: what users ask and what a healthy model answers.

Why a second generator beside `dsml_strategies`: that one draws random schemas and values
at the format's limits, which finds parser bugs; this one draws turns as they look in
production, which is where a degeneracy judge raises false alarms — batches of calls to
one tool with different arguments, prose with numbered lists, markdown tables and code,
legitimate repetition (a table's ``| --- |`` row, one phrase per item), and argument values
in the user's language, whatever script it is written in.  A value the user typed (a city,
a path, a query) is in the prompt; one the model authored (an email body, a file's code)
is not.  Each turn is a `dsml_strategies.Turn`, rendered by the formats' own encoders.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, NamedTuple

from tests.unit.probe.dsml_strategies import Turn

Args = dict[str, Any]

CITIES = (
    "Paris",
    "東京",
    "Москва",
    "القاهرة",
    "תל אביב",
    "Αθήνα",
    "서울",
    "São Paulo",
    "Zürich",
    "北京",
    "Kraków",
    "मुंबई",
    "กรุงเทพมหานคร",
    "İstanbul",
    "Reykjavík",
    "New York",
)
QUERIES = (
    "best GPU for LLM inference 2025",
    "как настроить nginx reverse proxy",
    "如何在 Kubernetes 中滚动更新",
    "أفضل مطاعم في دبي",
    "מתכון לחומוס",
    "Python asyncio vs threads",
    "東京 天気 明日",
    "서울 맛집 추천",
    "κανόνες οδικής κυκλοφορίας",
    "SGLang HiCache corruption",
)
PATHS = (
    "src/main.py",
    "README.md",
    "docs/设计文档.md",
    "config/settings.yaml",
    "tests/test_api.py",
    "data/отчёт_2024.csv",
    "notebooks/analysis.ipynb",
)
PEOPLE = ("ana@example.com", "li.wei@example.cn", "ivan@example.ru", "noa@example.co.il")
LANGUAGES = ("fr", "de", "zh", "ja", "ar", "ru", "he", "es", "ko")
SYMBOLS = ("AAPL", "NVDA", "TSLA", "BABA", "7203.T", "SAP.DE")
CODE = (
    "def add(a: int, b: int) -> int:\n    return a + b\n\n\nprint(add(2, 3))\n",
    "for i in range(10):\n    print(i)\n    print(i * i)\n",
    "SELECT id, name\nFROM users\nWHERE active = 1\nORDER BY name;\n",
    "#!/bin/sh\nset -eu\nmake build\nmake test\nmake deploy\n",
    "const xs = [1, 2, 3];\nconsole.log(xs.map((x) => x * 2));\n",
    "# " + "-" * 77 + "\n# Settings\n# " + "-" * 77 + "\nDEBUG = False\n",
    "date,requests,errors\n"
    + "".join(f"2025-03-{day:02d},{1000 + 7 * day},{day % 2}\n" for day in range(1, 29)),
    "".join(f"2025-03-01T10:00:{s:02d}Z INFO worker ok (shard {s % 4})\n" for s in range(30)),
)
"""File contents, CSV and logs among them: rows alike but for a date, a counter or an id."""
BODIES = (
    "Hi team,\n\nThe deploy is done:\n- API: ok\n- Web: ok\n- Jobs: ok\n\nThanks!",
    "Здравствуйте!\n\nОтчёт во вложении.\n\nС уважением,\nИван",
    "各位好：\n\n会议改到周五下午三点。\n\n谢谢！",
    "مرحباً،\n\nتم تأكيد الحجز.\n\nشكراً",
    "Row | Value\n--- | ---\nA | 1\nB | 2\nC | 3",
    "Reminder: ✅ tests ✅ lint ✅ docs — all green 🎉",
    "| Mon | Tue | Wed | Thu | Fri | Sat | Sun | Σ | Δ | % |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    "| 1 | 2 | 3 | 4 | 5 | 6 | 7 | 28 | +3 | 12 |",
    "To fill in:\n\n| name | role | start |\n| --- | --- | --- |\n"
    + "|      |      |       |\n" * 8,
)


def _city(rng: random.Random) -> Args:
    return {
        "city": rng.choice(CITIES),
        "unit": rng.choice(("celsius", "fahrenheit")),
        "days": rng.randint(1, 7),
    }


def _search(rng: random.Random) -> Args:
    return {"query": rng.choice(QUERIES), "max_results": rng.choice((5, 10, 20))}


def _read(rng: random.Random) -> Args:
    return {"path": rng.choice(PATHS)}


def _write(rng: random.Random) -> Args:
    return {"path": rng.choice(PATHS), "content": rng.choice(CODE)}


def _email(rng: random.Random) -> Args:
    return {
        "to": rng.sample(PEOPLE, rng.randint(1, 3)),
        "subject": rng.choice(("Status", "Отчёт", "会议通知", "تأكيد", "Re: deploy")),
        "body": rng.choice(BODIES),
    }


def _event(rng: random.Random) -> Args:
    day = rng.randint(1, 28)
    return {
        "title": rng.choice(("Standup", "Ревью", "周会", "اجتماع", "Planning 🗓️")),
        "start": f"2025-03-{day:02d}T09:00:00",
        "end": f"2025-03-{day:02d}T09:30:00",
        "attendees": rng.sample(PEOPLE, rng.randint(1, 4)),
    }


def _translate(rng: random.Random) -> Args:
    return {"text": rng.choice(BODIES), "target_lang": rng.choice(LANGUAGES)}


def _stock(rng: random.Random) -> Args:
    return {"symbol": rng.choice(SYMBOLS)}


def _sql(rng: random.Random) -> Args:
    return {"query": rng.choice(CODE[2:3]), "database": rng.choice(("prod", "analytics"))}


def _convert(rng: random.Random) -> Args:
    return {
        "amount": round(rng.uniform(1, 10_000), 2),
        "from": rng.choice(("USD", "EUR", "JPY")),
        "to": rng.choice(("CNY", "RUB", "ILS")),
    }


def _todo(rng: random.Random) -> Args:
    return {
        "item": rng.choice(("Buy milk", "Купить хлеб", "买菜", "شراء الخبز", "Fix bug #42")),
        "priority": rng.choice(("low", "medium", "high")),
        "tags": rng.sample(["home", "work", "urgent", "家", "работа"], rng.randint(0, 3)),
    }


def _grid(rng: random.Random) -> Args:
    """An empty board or a day of counters: data that repeats by nature."""
    fill = rng.choice((0, 0.0, False, None, "", "."))
    rows, columns = rng.randint(1, 12), rng.randint(3, 24)
    cells = [[fill] * columns for _ in range(rows)]
    return {"name": rng.choice(("board", "счётчики", "网格")), "cells": cells}


def _ping(rng: random.Random) -> Args:
    return {}


STRING = {"type": "string"}
INTEGER = {"type": "integer"}
STRINGS = {"type": "array", "items": STRING}


def _tool(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "parameters": schema}}


class Tool(NamedTuple):
    """One tool of the catalogue: its schema, how a call's arguments are drawn, and which
    arguments the user typed (they are in the prompt; the others the model authored)."""

    properties: dict[str, Any]
    required: list[str]
    draw: Callable[[random.Random], Args]
    typed: tuple[str, ...]


TOOLS: dict[str, Tool] = {
    "get_weather": Tool(
        {"city": STRING, "unit": {"enum": ["celsius", "fahrenheit"]}, "days": INTEGER},
        ["city"],
        _city,
        ("city",),
    ),
    "search_web": Tool({"query": STRING, "max_results": INTEGER}, ["query"], _search, ("query",)),
    "read_file": Tool({"path": STRING}, ["path"], _read, ("path",)),
    "write_file": Tool({"path": STRING, "content": STRING}, ["path", "content"], _write, ("path",)),
    "send_email": Tool(
        {"to": STRINGS, "subject": STRING, "body": STRING},
        ["to", "subject", "body"],
        _email,
        ("to",),
    ),
    "create_event": Tool(
        {"title": STRING, "start": STRING, "end": STRING, "attendees": STRINGS},
        ["title", "start"],
        _event,
        ("title",),
    ),
    "translate": Tool({"text": STRING, "target_lang": STRING}, ["text"], _translate, ("text",)),
    "get_stock_price": Tool({"symbol": STRING}, ["symbol"], _stock, ("symbol",)),
    "run_sql": Tool({"query": STRING, "database": STRING}, ["query"], _sql, ()),
    "convert_currency": Tool(
        {"amount": {"type": "number"}, "from": STRING, "to": STRING},
        ["amount", "from", "to"],
        _convert,
        ("amount",),
    ),
    "add_todo": Tool(
        {"item": STRING, "priority": {"enum": ["low", "medium", "high"]}, "tags": STRINGS},
        ["item"],
        _todo,
        ("item",),
    ),
    "init_grid": Tool(
        {"name": STRING, "cells": {"type": "array"}}, ["name", "cells"], _grid, ("name",)
    ),
    "ping": Tool({}, [], _ping, ()),
}

LANGUAGE_PAIRS = (
    ("Please do this for me:", "Let me check."),
    ("Сделай, пожалуйста:", "Сейчас проверю."),
    ("请帮我处理：", "好的，我来查一下。"),
    ("من فضلك نفّذ:", "سأتحقق من ذلك."),
    ("בבקשה תעשה:", "אבדוק את זה."),
    ("Bitte erledige das:", "Einen Moment, ich prüfe das."),
)
"""(what the user asks, the model's one-sentence answer): the model answers in the user's
language."""


def _prose_list(rng: random.Random, calls: list[tuple[str, Args]]) -> str:
    numbered = rng.random() < 0.5
    lines = [
        f"{f'{i}.' if numbered else '-'} {rng.choice(('Check', 'Look up', 'Handle'))} "
        f"`{name}` for {next(iter(args.values()), 'it')}"
        for i, (name, args) in enumerate(calls, start=1)
    ]
    return "I'll go through them one by one:\n\n" + "\n".join(lines)


def _prose_table(rng: random.Random, calls: list[tuple[str, Args]]) -> str:
    columns = ["#", "tool", *(f"col{i}" for i in range(rng.randint(1, 9)))]
    rows = [
        "| " + " | ".join([str(i), name, *("…" for _ in columns[2:])]) + " |"
        for i, (name, _) in enumerate(calls, start=1)
    ]
    header = "| " + " | ".join(columns) + " |"
    rule = "|" + "|".join(" --- " for _ in columns) + "|"
    return "Plan:\n\n" + "\n".join([header, rule, *rows])


def _prose_ascii_table(rng: random.Random, calls: list[tuple[str, Args]]) -> str:
    """A table drawn as psql or prettytable draw it: equal-width columns, ``+-----+`` rules."""
    width, columns = rng.randint(3, 8), rng.randint(3, 12)
    rule = "+" + ("-" * width + "+") * columns
    header = "|" + "|".join(f"{f'c{j}':^{width}}" for j in range(columns)) + "|"
    rows = [
        "|" + "|".join(f"{str(i * j)[:width]:^{width}}" for j in range(columns)) + "|"
        for i in range(1, len(calls) + 1)
    ]
    return "```\n" + "\n".join([rule, header, rule, *rows, rule]) + "\n```"


def _prose_banner(rng: random.Random, calls: list[tuple[str, Args]]) -> str:
    """A title underlined as wide as a terminal, then a line per call."""
    rule = rng.choice("=-─━#*_~") * rng.randint(40, 120)
    lines = (f"{i}. {name}" for i, (name, _) in enumerate(calls, start=1))
    return "Summary\n" + rule + "\n" + "\n".join(lines)


def _prose_code(rng: random.Random, calls: list[tuple[str, Args]]) -> str:
    return f"Here is the snippet I'll use:\n\n```python\n{rng.choice(CODE)}```\n\nNow the calls."


def _prose_repeated(rng: random.Random, calls: list[tuple[str, Args]]) -> str:
    return "\n".join(f"✅ Queued call {i} of {len(calls)}." for i in range(1, len(calls) + 1))


def _prose_none(rng: random.Random, calls: list[tuple[str, Args]]) -> str:
    return ""


PROSE = (
    _prose_none,
    _prose_list,
    _prose_table,
    _prose_ascii_table,
    _prose_banner,
    _prose_code,
    _prose_repeated,
)
REASONING = (
    None,
    None,
    "The user wants several lookups. I will batch them:\n1. first\n2. second\n3. third",
    "用户需要调用工具。先列出参数，再逐个调用。",
    "Need the tool. | a | b |\n|---|---|\n| 1 | 2 |",
)


def conversation(rng: random.Random) -> Turn:
    """One real-looking assistant turn: a batch of calls to one tool with different
    arguments (half the time), or calls to a few different tools, after prose of one kind
    (a sentence in the user's language, a list, a table, a banner, code, or a repeated
    line)."""
    if rng.random() < 0.5:
        name = rng.choice([n for n in TOOLS if n != "ping"])
        calls = _distinct(rng, name, rng.randint(2, 8))
    else:
        calls = [(n, TOOLS[n].draw(rng)) for n in rng.sample(sorted(TOOLS), rng.randint(1, 3))]
    tools = [
        _tool(n, TOOLS[n].properties, TOOLS[n].required) for n in dict.fromkeys(n for n, _ in calls)
    ]
    typed = [str(a[k]) for n, a in calls for k in TOOLS[n].typed if k in a]
    ask, sentence = rng.choice(LANGUAGE_PAIRS)
    prose = sentence if rng.random() < 0.3 else rng.choice(PROSE)(rng, calls)
    prompt = f"{ask} {', '.join(typed)}"
    return Turn(tools, calls, prompt, prose, rng.choice(REASONING))


def _distinct(rng: random.Random, name: str, size: int) -> list[tuple[str, Args]]:
    """Up to `size` calls of one tool, no two with the same arguments (a batch)."""
    seen: dict[str, Args] = {}
    for _ in range(size * 3):
        args = TOOLS[name].draw(rng)
        seen.setdefault(repr(sorted(args.items())), args)
        if len(seen) == size:
            break
    return [(name, args) for args in seen.values()]
