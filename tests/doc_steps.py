"""The files and commands a documentation page shows, for the tests that run a page as written.

A fenced ``python`` block whose first line is ``# PATH`` is the file PATH; each line of a fenced ``bash`` block is a
command, but for comments and ``pip install`` lines (the package under test is installed already).
"""

from __future__ import annotations

import re
from pathlib import Path

#: a fenced block: its label (possibly none) and its body
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)


def doc_steps(doc: Path) -> tuple[dict[str, str], list[str]]:
    """(path -> contents of every file ``doc`` shows, its commands in order)."""
    files, commands = {}, []
    for lang, body in FENCE.findall(doc.read_text()):
        if lang == "python":
            first, _, rest = body.partition("\n")
            assert first.startswith("# "), f"a python block in {doc.name} must start with '# PATH': {first!r}"
            assert first[2:].strip() not in files, f"{first[2:].strip()} written by two blocks of {doc.name}"
            files[first[2:].strip()] = rest
        elif lang == "bash":
            for line in body.splitlines():
                line = line.split("  #")[0].strip()
                if line and not line.startswith("#") and not line.startswith("pip install"):
                    commands.append(line)
    return files, commands
