"""`python tour_watch.py STATE... -- COMMAND...`: a README watch (`kubectl get ... -w`) with an end.

A person stops a watch with Ctrl-C once the row shows what the README says it will.  This
runs COMMAND, echoes its lines, and stops it once its lines have shown every STATE, in
order (each a whitespace-separated word of a line); exit 0 then, 1 if COMMAND ended or
$TOUR_WATCH_TIMEOUT_S (default 1200) passed first, naming the state it was waiting for.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time


def main(argv: list[str]) -> int:
    split = argv.index("--")
    states, command = argv[:split], argv[split + 1 :]
    deadline = time.monotonic() + float(os.environ.get("TOUR_WATCH_TIMEOUT_S", "1200"))
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    seen = 0
    try:
        while seen < len(states):
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                print(f"tour_watch: timed out waiting for {states[seen]}", file=sys.stderr)
                return 1
            if line is None:
                print(f"tour_watch: the watch ended before {states[seen]}", file=sys.stderr)
                return 1
            print(line, end="", flush=True)
            while seen < len(states) and states[seen] in line.split():
                seen += 1
        return 0
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
