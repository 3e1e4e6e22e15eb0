"""The probe's command line, defined once beside the settings it spells: the options of
`dsv4ctl probe` that make a `ProbeSettings`.

The CLI adds them to its parser (`add_arguments`) and reads them back (`settings_from`); a
rollout's probe Job writes them (`probe_args`).  Each option's type, choices and default
are the settings field's own, so the parser, the Job and the model cannot say different
things: settings → `probe_args` → the CLI's parser → `settings_from` is the identity.
"""

from __future__ import annotations

import argparse
import types
from dataclasses import dataclass
from enum import Enum
from typing import Any, Union, get_args, get_origin

from pydantic import ValidationError

from dsv4_engine.cliutil import CommandError
from dsv4_engine.probe.exitcodes import USAGE_OR_CONNECTION_ERROR
from dsv4_engine.probe.settings import ProbeName, ProbeSettings
from dsv4_engine.probe.verdict import exercised_needed

NO_OFFLOAD = "none"  # --admin-offload-path: no offload (the setting's None)


@dataclass(frozen=True)
class Option:
    """A `ProbeSettings` field as the option ``--<flag>``; the option's `dest` is the flag
    with `_` for `-`."""

    field: str
    flag: str
    help: str | None = None

    @property
    def dest(self) -> str:
        return self.flag.replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        info = ProbeSettings.model_fields[self.field]
        kind = _without_none(info.annotation)
        default = info.default
        if kind is bool:  # a switch: --flag / --no-flag
            action = argparse.BooleanOptionalAction
            parser.add_argument(f"--{self.flag}", action=action, default=default, help=self.help)
        elif isinstance(kind, type) and issubclass(kind, Enum):
            choices = [member.value for member in kind]
            default = default.value if isinstance(default, Enum) else default
            parser.add_argument(f"--{self.flag}", choices=choices, default=default, help=self.help)
        else:
            parser.add_argument(f"--{self.flag}", type=kind, default=default, help=self.help)

    def argv(self, settings: ProbeSettings) -> list[str]:
        value = getattr(settings, self.field)
        if value is None:
            return []
        if isinstance(value, bool):
            return [f"--{self.flag}" if value else f"--no-{self.flag}"]
        return [f"--{self.flag}", str(value.value if isinstance(value, Enum) else value)]


def _without_none(annotation: Any) -> Any:
    """``int`` of ``int | None``: what the option's text converts to."""
    if get_origin(annotation) in (Union, types.UnionType):
        (kind,) = (a for a in get_args(annotation) if a is not type(None))
        return kind
    return annotation


# Every settings field with an option of its own, in `--help` order.  The URL (positional),
# `--probes` (a comma-separated list) and `--admin-offload-path` ('none' for no offload)
# are spelled by hand below.
OPTIONS: tuple[Option, ...] = (
    Option("backend", "backend"),
    Option("model", "model", "model name (default: first of GET /v1/models)"),
    Option("format", "format"),
    Option("concurrency", "concurrency"),
    Option(
        "requests",
        "requests",
        "judged samples to collect (default: the fewest that can PASS at the rate and "
        "confidence, 598 at 0.5%% and 95%%; the canary's default is the same)",
    ),
    Option("max_corruption_rate", "max-corruption-rate"),
    Option("confidence", "confidence"),
    Option(
        "warm_up_s",
        "warm-up",
        "seconds the first request (a warm-up, not judged) may keep failing before the "
        "engine counts as not answering (exit 3, or INCONCLUSIVE filed); after it, every "
        "failed request counts as a failure",
    ),
    Option("max_tokens", "max-tokens", "tokens of each tool-call answer (default per backend)"),
    Option("request_timeout_s", "timeout", "seconds per request"),
    Option("max_duration_s", "max-duration", "seconds; stop starting samples after"),
    Option("prefix_words", "prefix-words", "shared prefix length (default per backend)"),
    Option("sessions_per_prefix", "sessions-per-prefix"),
    Option(
        "long_context_words",
        "long-context-words",
        "long-context prompt length, > index_topk x compress ratio tokens (default per backend)",
    ),
    Option("seed", "seed"),
    Option("deterministic", "deterministic"),
    Option(
        "reference_model",
        "reference-model",
        "the model a reference engine serves, for its default probe set (default: ask its "
        "GET /server_info, which sglang-router does not serve)",
    ),
    Option(
        "baseline_url",
        "baseline-url",
        "the stable side's URL: on an engine that is not deterministic, the consistency "
        "probes run on both and the canary's divergence is judged against the stable's",
    ),
    Option(
        "max_divergence_excess",
        "max-divergence-excess",
        "how far the canary's warm-vs-cold divergence rate may exceed the baseline's",
    ),
    Option(
        "stream_share",
        "stream-share",
        "share of tool-call samples whose judged request streams (tool calls assembled "
        "from OpenAI deltas, judged like the rest)",
    ),
    Option(
        "kv_canary",
        "kv-canary",
        "the engines run SGLang's kv-canary: read their violations through the router's "
        "GET /engine_metrics before and after the run; any new one FAILs it",
    ),
    Option(
        "hicache",
        "hicache",
        "the engine runs HiCache: PASS only if enough judged answers are proven to have read "
        "a prefix back from its host tier, by the engines' own count of host-tier tokens "
        "(sglang:cached_tokens_total{cache_source=host}) read through the router's GET "
        f"/engine_metrics ({exercised_needed(0.95)} at 95%% confidence)",
    ),
)
# The fields spelled by hand, and those with no option: a Job cannot be told the latter, so
# `probe_args` refuses settings that set them.
BY_HAND = ("base_url", "probes", "admin_offload_path")
NOT_OPTIONS = ("consistency_max_tokens", "connect_timeout_s", "api_key")
# A field's option, as an error names it.
FLAG = {"base_url": "url", **{o.field: o.flag for o in OPTIONS}}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The URL and every option that sets a `ProbeSettings` field."""
    parser.add_argument("url", help="engine or router base URL, e.g. http://127.0.0.1:30000")
    parser.add_argument(
        "--probes",
        help=f"comma-separated probe set (default per backend): {', '.join(p.value for p in ProbeName)}",
    )
    for option in OPTIONS:
        option.add_to(parser)
    parser.add_argument(
        "--admin-offload-path",
        default=ProbeSettings.model_fields["admin_offload_path"].default,
        help="a reference-engine test knob: POST path pushing cached prefixes to the host "
        "tier before each judged request ('default': the reference engine's; "
        f"{NO_OFFLOAD!r} or unset: off, the host tier is reached by eviction)",
    )


def settings_from(args: argparse.Namespace) -> ProbeSettings:
    """The settings ``args`` (parsed by a parser `add_arguments` filled) ask for; a bad value
    is a `CommandError` naming its option."""
    probes = []
    for name in filter(None, (args.probes or "").split(",")):
        try:
            probes.append(ProbeName(name.strip()))
        except ValueError:
            valid = ", ".join(p.value for p in ProbeName)
            raise CommandError(
                f"--probes: unknown probe {name!r} (one of {valid})", USAGE_OR_CONNECTION_ERROR
            ) from None
    offload = None if args.admin_offload_path == NO_OFFLOAD else args.admin_offload_path
    fields = {o.field: getattr(args, o.dest) for o in OPTIONS}
    try:
        return ProbeSettings(
            base_url=args.url, probes=tuple(probes), admin_offload_path=offload, **fields
        )
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(map(str, first["loc"])) or "settings"
        option = FLAG.get(field, field.replace("_", "-"))
        raise CommandError(f"--{option}: {first['msg']}", USAGE_OR_CONNECTION_ERROR) from None


def probe_args(settings: ProbeSettings) -> list[str]:
    """The `dsv4ctl probe` arguments that parse back to ``settings``: a probe Job's command.

    Every option is spelled out, defaults included, so the Job shows exactly what it runs.
    """
    defaults = ProbeSettings(base_url=settings.base_url)
    unsupported = [f for f in NOT_OPTIONS if getattr(settings, f) != getattr(defaults, f)]
    if unsupported:
        raise ValueError(f"dsv4ctl probe has no option for {', '.join(unsupported)}")
    args = [settings.base_url]
    if settings.probes:
        args += ["--probes", ",".join(p.value for p in settings.probes)]
    offload = settings.admin_offload_path
    args += ["--admin-offload-path", NO_OFFLOAD if offload is None else offload]
    for option in OPTIONS:
        args += option.argv(settings)
    return args
