"""One process that has imported SGLang and run none of it, forking a fresh child for each
harness run (tests/sglang/conftest.py's `fresh_process`).

Why: every harness needs a process of its own (SGLang's hooks, plugins and runtime context
are process-wide), and importing SGLang costs ~10 CPU-s, which `make test` paid once per
harness run.  A child forked from here is, to SGLang, a process that has just imported it:
nothing here loads a plugin, publishes server args, builds a pool or patches a class.  The
child runs the harness as `python HARNESS ARGS` would, with the caller's argv, environment,
stdin, stdout and stderr.

Protocol: one JSON line per run on stdin, `{"argv", "env", "stdin", "stdout", "stderr"}`
(the last three are file paths), answered by `{"returncode": N}` on stdout once the child
has exited.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import traceback
from typing import Any, NoReturn

# What every harness imports first, and most of the cost: SGLang's runtime utilities (torch,
# transformers, triton with them), its plugin loader, the DeepSeek-V4 pool and its configurator.
import sglang.srt.managers.cache_controller  # noqa: F401
import sglang.srt.mem_cache.deepseek_v4_memory_pool  # noqa: F401
import sglang.srt.model_executor.pool_configurator  # noqa: F401
import sglang.srt.plugins  # noqa: F401


def child(request: dict[str, Any]) -> NoReturn:
    """Becomes `python ARGV...`: the caller's environment and files, the script as __main__."""
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, flags in (
        (0, request["stdin"], os.O_RDONLY),
        (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        opened = os.open(path, flags, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - fd 0 lives as long as the process
    sys.argv = list(request["argv"])
    code = 0
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as stop:  # as the interpreter reports it
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - an uncaught exception, as the interpreter prints it
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main() -> None:
    answers = sys.stdout
    for line in sys.stdin:
        pid = os.fork()
        if pid == 0:
            child(json.loads(line))
        _, status = os.waitpid(pid, 0)
        answers.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
