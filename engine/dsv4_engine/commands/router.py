"""`dsv4-engine router`: the minimal PD router in front of reference prefill/decode servers.

    dsv4-engine router --prefill http://127.0.0.1:30001 8998 --decode http://127.0.0.1:30002

(the shape of `sglang_router.launch_router --pd-disaggregation`).  Ready when GET /health
answers 200, which it does once every worker does.
"""

from __future__ import annotations

import argparse

from dsv4_engine.cliutil import CommandError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("router", help="minimal PD router for reference engines")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument(
        "--prefill",
        nargs="+",
        action="append",
        required=True,
        metavar=("URL", "BOOTSTRAP_PORT"),
        help="a prefill server and its --disaggregation-bootstrap-port (default 8998)",
    )
    p.add_argument("--decode", action="append", required=True, metavar="URL")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from aiohttp import web

    from dsv4_engine.commands.serve import check_port_free
    from dsv4_engine.reference.router import PrefillWorker, Router

    prefills = []
    for spec in args.prefill:
        if len(spec) > 2:
            raise CommandError(f"--prefill {' '.join(spec)}: expected URL [BOOTSTRAP_PORT]")
        port = spec[1] if len(spec) == 2 else "8998"
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise CommandError(
                f"--prefill {' '.join(spec)}: bootstrap port {port!r} is not 1..65535"
            )
        if not spec[0].startswith(("http://", "https://")):
            raise CommandError(f"--prefill {spec[0]}: expected an http:// URL")
        prefills.append(PrefillWorker(spec[0].rstrip("/"), int(port)))
    for url in args.decode:
        if not url.startswith(("http://", "https://")):
            raise CommandError(f"--decode {url}: expected an http:// URL")
    check_port_free(args.host, args.port, "--port")
    router = Router(prefills, args.decode)
    print(f"dsv4-engine router: ready on http://{args.host}:{args.port}", flush=True)
    web.run_app(router.app(), host=args.host, port=args.port, print=None, access_log=None)
    return 0
