"""Close SGLang's management endpoints in the engine's HTTP server: no call opens them.

SGLang 0.5.23 marks its management endpoints ``ADMIN_OPTIONAL`` (``@auth_level`` in
``sglang/srt/entrypoints/http_server.py``): weight updates (``/update_weights_from_disk``,
``_from_tensor``, ``_from_distributed``, ``_from_ipc``, ...), LoRA adapters
(``/load_lora_adapter``), ``/pause_generation``, ``/release_memory_occupation``,
``/flush_cache``, profiling, ``/set_internal_state`` and more.  ``decide_request_auth``
(``sglang/srt/utils/auth.py``) lets such a call through when no key is configured.  Each of
them changes what the engine serves, or drops what it holds, without a revision, so without
a canary.

An admin key would not close them.  ``--admin-api-key`` is a plain server argument:
``GET /server_info`` returns every resolved server argument (``build_server_info`` →
``ServerArgs.resolved_dict``; only watermark secrets are redacted), and ``/server_info`` is a
``NORMAL`` endpoint, open to every caller unless ``--api-key`` is set too, which every client
(the router, the probes) would then need.  So anyone who can reach the port to call an admin
endpoint can first read the key from the same port.  And a key the operator generated would
need a Secret, which the operator may not write (docs/install.md).

What closes them instead is SGLang's own ``ADMIN_FORCE`` level: "requires admin_api_key; if
admin_api_key is NOT configured, it must be rejected (403) even if api_key is provided".
The plugin raises every ``ADMIN_OPTIONAL`` endpoint of the HTTP app to ``ADMIN_FORCE``
before the server starts; the launcher installs SGLang's auth middleware whenever an
``ADMIN_FORCE`` endpoint exists (``app_has_admin_force_endpoints``), and the engine is
started with no admin key (``--admin-api-key`` is refused in ``extraArgs``), so every call
to them is answered 403 by SGLang's code.  Nothing the operator runs calls them: weights,
adapters and memory change through the spec and its canary.

SGLang applies that middleware only with one tokenizer worker (``--tokenizer-worker-num``,
which ``extraArgs`` may not set for that reason).  The app lives in the process that runs
``sglang.launch_server`` as its main module, which loads plugins first thing; the plugin
leaves SGLang's other processes (schedulers, detokenizer: spawned children) alone.
"""

from __future__ import annotations

import importlib
import multiprocessing
import sys
from typing import Any

from dsv4_engine.index_k import SGLANG_VERSION

LAUNCHER = "sglang.launch_server"
HTTP_SERVER = "sglang.srt.entrypoints.http_server"


def serves_http() -> bool:
    """Whether this is the process whose HTTP app serves the engine's endpoints."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return multiprocessing.parent_process() is None and getattr(spec, "name", None) == LAUNCHER


def close(app: Any) -> list[str]:
    """Raise every ADMIN_OPTIONAL endpoint of ``app`` to ADMIN_FORCE; returns their paths.
    An SGLang without the levels stops the engine (fail closed: the endpoints would stay
    open)."""
    try:
        from sglang.srt.utils.auth import AuthLevel, app_has_admin_force_endpoints
    except ImportError as err:
        raise SystemExit(_cannot(str(err))) from None
    closed = []
    for route in app.router.routes:
        endpoint = getattr(route, "endpoint", None)
        if getattr(endpoint, "_auth_level", None) == AuthLevel.ADMIN_OPTIONAL:
            endpoint._auth_level = AuthLevel.ADMIN_FORCE
            closed.append(route.path)
    if not app_has_admin_force_endpoints(app):  # else SGLang installs no auth at all
        raise SystemExit(_cannot("no endpoint is marked ADMIN_OPTIONAL or ADMIN_FORCE"))
    return closed


def _cannot(why: str) -> str:
    return (
        f"dsv4_index_k: cannot close SGLang's admin endpoints ({why}). The plugin is "
        f"written for SGLang {SGLANG_VERSION}: refusing to start with them open."
    )


def install() -> None:
    """In the HTTP server's process: close the app's admin endpoints before it serves."""
    if serves_http():
        close(importlib.import_module(HTTP_SERVER).app)
