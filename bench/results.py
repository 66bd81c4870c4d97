"""bench/RESULTS.md's writer: each bench replaces its own section with what it just printed."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.table import Table
from rich.text import Text

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "RESULTS.md"
SCRIPT = Path(sys.argv[0]).resolve()  # now: a bench may chdir before it publishes

Part = Table | Text | str  # a rich table, rich text (markup already parsed), or markdown as it stands


def add_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-results", action="store_true",
                        help="print the figures but leave bench/RESULTS.md as it is (trial runs)")


def publish(args: argparse.Namespace, name: str, *parts: Part) -> None:
    """Write section `name` from what the bench printed, unless the run was asked not to."""
    if not args.no_results:
        path = write_section(name, "\n\n".join(markdown(p) for p in parts), command(), machine())
        print(f"wrote section {name} of {path.relative_to(REPO)}")


def write_section(name: str, body: str, command: str | None = None, machine: str | None = None,
                  path: Path = RESULTS) -> Path:
    """Replace what lies between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->` (or add the section at
    the end), stamped with the command, date, commit and machine; the rest of the file stays as it is.
    The file is replaced in one rename, so a reader never sees half of it."""
    stamp = "" if command is None else (
        f"`{command}` · {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC · commit {commit()} · {machine}\n\n")
    section = f"<!-- bench:{name} -->\n## {name}\n\n{stamp}{body.strip()}\n<!-- /bench:{name} -->"
    text = path.read_text() if path.exists() else ""
    pattern = re.compile(rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->", re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text, count=1)
    else:
        text = f"{text.rstrip()}\n\n{section}\n" if text.strip() else f"{section}\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def section(name: str, path: Path = RESULTS) -> str | None:
    """The current text of section `name`, or None when the file has none."""
    text = path.read_text() if path.exists() else ""
    found = re.search(rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->", text, re.DOTALL)
    return found.group(0) if found else None


def markdown(part: Part) -> str:
    if isinstance(part, Table):
        return _table(part)
    return part.plain if isinstance(part, Text) else part


def _cell(value: object) -> str:
    plain = value.plain if isinstance(value, Text) else Text.from_markup(str(value)).plain
    return plain.replace("|", "\\|").replace("\n", " ")


def _table(table: Table) -> str:
    rows = list(zip(*(list(c.cells) for c in table.columns), strict=True))
    lines = [f"**{_cell(table.title)}**", ""] if table.title else []
    lines.append("| " + " | ".join(_cell(c.header) for c in table.columns) + " |")
    lines.append("|" + "|".join("---:" if c.justify == "right" else "---" for c in table.columns) + "|")
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def command() -> str:
    """How this bench was started, as it would be typed from the repository root."""
    shown = SCRIPT.relative_to(REPO) if SCRIPT.is_relative_to(REPO) else SCRIPT
    return shlex.join(["python", str(shown), *sys.argv[1:]])


def commit() -> str:
    def git(*cmd: str) -> str:
        return subprocess.run(["git", *cmd], cwd=REPO, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return f"{head} + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else head


def machine() -> str:
    """One line: cores, CPU model, memory, and the load average as the figures are written (other work
    on the machine moves every figure)."""
    model = platform.processor() or platform.machine()
    try:
        found = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
        model = found.group(1).strip() if found else model
        memory = f", {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB"
    except (OSError, ValueError):
        memory = ""
    return (f"{os.cpu_count()} cores, {model}{memory}, {platform.system()}; load average "
            f"{os.getloadavg()[0]:.1f} when written")
