"""SGLang's own launcher and HTTP app, as far as they run without a GPU, then calls to the
app's management endpoints; one JSON line of what happened.

1. ``python -m sglang.launch_server --help`` as SGLang's launcher module: it loads the
   installed plugins first thing (``SGLANG_PLUGINS`` picks them), then argparse prints the
   help and exits.  That is as far as a server start goes on CPU.
2. SGLang's condition for its auth middleware, as ``http_server.launch_server`` applies it
   in single tokenizer mode with no key configured (the operator's engines): installed
   only when the app has an ``ADMIN_FORCE`` endpoint.
3. How many of the app's routes are at each auth level, and a POST to each path in argv, through the app (starlette's TestClient), with no
   Authorization header and with a guessed bearer token.

Run as a script in its own process (the app and its routes are module-level state).
"""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import sys


def main() -> None:
    paths = sys.argv[1:]
    sys.argv = ["sglang.launch_server", "--help"]
    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):
        runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)

    from sglang.srt.entrypoints.http_server import app
    from sglang.srt.utils.auth import (
        AuthLevel,
        add_api_key_middleware,
        app_has_admin_force_endpoints,
    )
    from starlette.testclient import TestClient

    levels = {
        route.path: getattr(getattr(route, "endpoint", None), "_auth_level", AuthLevel.NORMAL)
        for route in app.router.routes
        if getattr(route, "path", None) in paths
    }
    every = [
        getattr(getattr(route, "endpoint", None), "_auth_level", AuthLevel.NORMAL)
        for route in app.router.routes
    ]
    counts = {level.value: every.count(level) for level in AuthLevel}
    middleware = app_has_admin_force_endpoints(app)
    if middleware:
        add_api_key_middleware(app, api_key=None, admin_api_key=None)
    client = TestClient(app, raise_server_exceptions=False)
    answers = {
        path: [
            client.post(path, json={}).status_code,
            client.post(path, json={}, headers={"Authorization": "Bearer guessed"}).status_code,
        ]
        for path in paths
    }
    print(
        "RESULT "
        + json.dumps(
            {
                "counts": counts,
                "levels": {p: level.value for p, level in levels.items()},
                "middleware": middleware,
                "answers": answers,
            }
        )
    )


if __name__ == "__main__":
    main()
