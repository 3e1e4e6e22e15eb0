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

import functools
import json
import os
import runpy
import sys
from typing import Any

from dsv4_dev.localrun.forks import exit_as_interpreter, preload

# What every harness imports first, and most of the cost: SGLang's runtime utilities (torch,
# transformers, triton with them), its plugin loader, the DeepSeek-V4 pool and its configurator.
PRELOAD = (
    "sglang.srt.managers.cache_controller",
    "sglang.srt.mem_cache.deepseek_v4_memory_pool",
    "sglang.srt.model_executor.pool_configurator",
    "sglang.srt.plugins",
)


def run(request: dict[str, Any]) -> None:
    """`python ARGV...` in a forked child: the caller's environment and files, the script
    as __main__."""
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
    runpy.run_path(sys.argv[0], run_name="__main__")


def main() -> None:
    answers = preload(PRELOAD)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            answers.close()
            exit_as_interpreter(functools.partial(run, request))
        _, status = os.waitpid(pid, 0)
        answers.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
