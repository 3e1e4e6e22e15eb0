"""Generated sections of the docs: a table written between a begin and an end marker of a
Markdown page, the rest of the page left as people wrote it.

`hack/` scripts generate the tables (`make manifests` runs them) and tests compare the
committed page with a rewrite, so a stale table fails a test instead of misleading a reader.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DocSection:
    doc: Path  # the page, by default
    begin: str
    end: str
    what: str  # what the section holds, for the script's one line of output

    def rewrite(self, text: str, body: str) -> str:
        """``text`` with ``body`` between the markers; a page without them is an error."""
        head, begin, rest = text.partition(self.begin)
        _, end, tail = rest.partition(self.end)
        if not begin or not end:
            raise SystemExit(f"{self.doc}: the markers {self.begin!r} and {self.end!r} are missing")
        return f"{head}{self.begin}\n{body}\n{self.end}{tail}"

    def main(self, body: str) -> None:
        """Rewrite the page named on the command line (default: `doc`) with ``body``."""
        path = Path(sys.argv[1]) if len(sys.argv) > 1 else self.doc
        path.write_text(self.rewrite(path.read_text(), body))
        print(f"wrote {self.what} into {path}")
