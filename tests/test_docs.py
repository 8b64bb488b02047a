"""The docs run: every fenced block of README.md and docs/*.md marked runnable is executed, README.md stays a front
page, and every relative link points at a file that exists.

A block is runnable when the line right before its opening fence is `<!-- runnable -->` (invisible on GitHub).
```python blocks run in a fresh `python -c` from the repository root; ```bash, ```sh and ```console blocks (`$ `
prompts stripped, a console block's other lines being output) run with `bash -e` there, with the virtual
environment's bin/ first on PATH. Each block runs in a process group of its own and must leave no process behind:
a block that starts a server stops it itself.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = "<!-- runnable -->"
README_MAX_LINES = 250
TIMEOUT_S = 120
# A server a block stopped may take a moment to exit after the block's own shell has.
LEFTOVER_GRACE_S = 15

FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})\s*(?P<lang>[^\s`]*)")
PYTHON = {"python", "py"}
SHELL = {"bash", "sh", "shell", "console"}
VENV_BIN = ROOT / ".venv" / "bin"
BIN = VENV_BIN if (VENV_BIN / "python").exists() else Path(sys.executable).parent


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    runnable: bool

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def fenced_blocks(path: Path) -> list[Block]:
    """Every fenced code block of a markdown file, with its language and whether the marker precedes it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i].lstrip())
        if not match:
            i += 1
            continue
        fence, start = match["fence"], i
        indent = len(lines[i]) - len(lines[i].lstrip())
        i += 1
        body = []
        while i < len(lines) and not lines[i].strip().startswith(fence[0] * len(fence)):
            line = lines[i]
            body.append(line[indent:] if line[:indent].strip() == "" else line.lstrip())  # a list item's indent
            i += 1
        runnable = start > 0 and lines[start - 1].strip() == MARKER
        blocks.append(Block(path, start + 1, match["lang"].lower(), "\n".join(body) + "\n", runnable))
        i += 1
    return blocks


ALL_BLOCKS = [block for path in DOC_FILES for block in fenced_blocks(path)]
RUNNABLE = [block for block in ALL_BLOCKS if block.runnable]


def shell_script(block: Block) -> str:
    """The commands of a shell block: a console block keeps only its `$ ` lines (and their continuations)."""
    if block.lang != "console":
        return "\n".join(line[2:] if line.startswith("$ ") else line for line in block.code.splitlines()) + "\n"
    commands, continued = [], False
    for line in block.code.splitlines():
        if line.startswith("$ ") or continued:
            commands.append(line[2:] if line.startswith("$ ") and not continued else line)
            continued = line.rstrip().endswith("\\")
    return "\n".join(commands) + "\n"


def command_for(block: Block) -> list[str]:
    if block.lang in PYTHON:
        return [str(BIN / "python"), "-c", block.code]
    if block.lang in SHELL:
        return ["bash", "-e", "-c", shell_script(block)]
    raise AssertionError(f"{block.name}: a runnable block must be python, bash, sh or console, not {block.lang!r}")


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member that changed its credentials: still there
        return True
    return True


def snippet_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(BIN.parent)
    env.pop("PYTHONPATH", None)
    # No snippet may reach the network: the Hub stays offline, Gradio sends no analytics.
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False")
    env.update(PYTHONUNBUFFERED="1", PYTHONIOENCODING="utf-8")
    # As tests/conftest.py does for the tests: on a loaded 2-core machine PyTorch's OpenMP threads, which spin while
    # they wait for each other, made one snippet 5x slower. A snippet that asks for threads still gets them.
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@pytest.mark.parametrize("block", RUNNABLE, ids=[block.name for block in RUNNABLE])
def test_runnable_block(block: Block):
    with tempfile.TemporaryFile(mode="w+b") as log:
        process = subprocess.Popen(
            command_for(block),
            cwd=ROOT,
            env=snippet_env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so whatever it starts can be found and stopped
        )
        problem = None
        try:
            process.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            problem = f"ran past {TIMEOUT_S} s"
        finally:
            deadline = time.monotonic() + (0 if problem else LEFTOVER_GRACE_S)
            while group_alive(process.pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if group_alive(process.pid):
                problem = problem or f"left processes running {LEFTOVER_GRACE_S} s after it ended"
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.seek(0)
        output = log.read().decode("utf-8", errors="replace")
    if problem is None and process.returncode != 0:
        problem = f"exited with status {process.returncode}"
    if problem:
        pytest.fail(f"{block.name} ({block.lang}) {problem}; its output ends with:\n{output[-4000:]}", pytrace=False)


def test_runnable_markers_precede_a_fence():
    """A marker anywhere but right before a fence would silently leave the snippet it means untested."""
    misplaced = []
    for path in DOC_FILES:
        lines = path.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, start=1):
            if line.strip() == MARKER and (number == len(lines) or not FENCE.match(lines[number].lstrip())):
                misplaced.append(f"{path.relative_to(ROOT)}:{number}")
    assert not misplaced, f"{MARKER} must be the line right before an opening fence: {misplaced}"
    assert RUNNABLE, "no runnable block found: is the marker spelled right?"
    assert {block.lang for block in RUNNABLE} <= PYTHON | SHELL, [(b.name, b.lang) for b in RUNNABLE]


def test_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, more than {README_MAX_LINES}: move details to docs/"
    )


def test_most_readme_snippets_run():
    readme = [block for block in ALL_BLOCKS if block.path.name == "README.md"]
    runnable = [block for block in readme if block.runnable]
    assert len(runnable) * 2 > len(readme), f"only {len(runnable)} of README.md's {len(readme)} blocks are runnable"


# --- links -----------------------------------------------------------------------------------------------------

LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"`+[^`]*`+")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def outside_fences(path: Path) -> list[tuple[int, str]]:
    """The file's lines that are not part of a fenced code block, with their 1-based numbers."""
    fenced = {n for b in fenced_blocks(path) for n in range(b.line, b.line + b.code.count("\n") + 2)}
    lines = path.read_text(encoding="utf-8").splitlines()
    return [(n, line) for n, line in enumerate(lines, start=1) if n not in fenced]


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: its text (links and backticks dropped) in lower case, punctuation other
    than hyphens and underscores removed, spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return "".join(c for c in text if c in "-_ " or unicodedata.category(c)[0] in "LN").replace(" ", "-")


def github_anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file; a repeated heading gets -1, -2, ... as on GitHub."""
    anchors, seen = set(), {}
    for _, line in outside_fences(path):
        if match := HEADING.match(line):
            slug = github_anchor(match[2])
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def relative_links() -> list[tuple[Path, int, str]]:
    links = []
    for path in DOC_FILES:
        for number, line in outside_fences(path):
            for target in LINK.findall(INLINE_CODE.sub("", line)):
                if not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
                    links.append((path, number, target))
    return links


def test_relative_links_point_at_files():
    broken = []
    for path, number, target in relative_links():
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if not resolved.exists():
            broken.append(f"{where} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in github_anchors(resolved):
            broken.append(f"{where} (no heading with that anchor)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_link_checker_sees_links():
    """The link test above cannot pass vacuously: the README links to the docs and shows a screenshot."""
    targets = [target for path, _, target in relative_links() if path.name == "README.md"]
    assert any(target.startswith("docs/") and target.endswith(".png") for target in targets), targets
    assert sum(target.startswith("docs/") and ".md" in target for target in targets) >= 5, targets


@pytest.mark.parametrize(
    "heading, anchor",
    [
        ("The lesson's loss ladder", "the-lessons-loss-ladder"),
        ("Through the demo's `/generate`", "through-the-demos-generate"),
        ("Decode speed (batch 1)", "decode-speed-batch-1"),
        ("gpt_serve without torch", "gpt_serve-without-torch"),
        ("In the browser (onnxruntime-web)", "in-the-browser-onnxruntime-web"),
    ],
)
def test_github_anchor(heading, anchor):
    assert github_anchor(heading) == anchor
