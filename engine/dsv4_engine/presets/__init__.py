"""Published model configs shipped as named presets (``dsv4ctl plan --preset v4-flash``).

The JSON files are the ``config.json`` of the Hugging Face repositories
deepseek-ai/DeepSeek-V4-Flash and deepseek-ai/DeepSeek-V4-Pro, unchanged (config only,
no weights); see README.md.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from dsv4_engine.configurator.errors import ConfigError

PRESETS = {"v4-flash": "deepseek-v4-flash.json", "v4-pro": "deepseek-v4-pro.json"}


def preset_config(name: str) -> dict[str, Any]:
    """The HF config dict of a named preset."""
    try:
        filename = PRESETS[name]
    except KeyError:
        raise ConfigError(
            f"preset: unknown preset {name!r}; expected one of {', '.join(PRESETS)}"
        ) from None
    return json.loads(resources.files(__package__).joinpath(filename).read_text())
