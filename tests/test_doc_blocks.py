"""The documentation runs: every ```python block of README.md, docs/*.md and bench/README.md.

The blocks of one file run in order in one namespace, so a later block uses the names an earlier one
made. A block opts out only with a visible marker on the line before its fence,
``<!-- not-run: reason -->`` (multi-process launches, CUDA-only code). Bash blocks are not run.
The README's two commands are checked against the one CI runs, and every relative link in these files
must lead to a file (and heading) that exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]
NOT_RUN = re.compile(r"^<!-- not-run: \S.* -->$")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
INSTALL = "python3 -m venv .venv && .venv/bin/pip install -q torch==2.13.0 -e '.[test]' && "
DEMO = INSTALL + ".venv/bin/python -m remat.demo"
SUITE = INSTALL + ".venv/bin/python -m pytest -q"


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    skip_reason: str | None


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, with the not-run marker that precedes it, if any."""
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence or not fence.group(1):
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        assert end is not None, f"{path.name}:{i + 1}: a code block is never closed"
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = NOT_RUN.match(before.strip())
        found.append(Block(i + 1, fence.group(1), "\n".join(lines[i + 1:end]) + "\n",
                           before.strip()[len("<!-- not-run: "):-len(" -->")] if marker else None))
        i = end + 1
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    in_code, found = False, set()
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


def test_blocks_are_parsed_with_their_markers(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text("text\n```python\na = 1\n```\n<!-- not-run: needs two ranks -->\n\n```python\nb = 2\n```\n"
                   "```bash\nls\n```\n")
    found = blocks(doc)
    assert [(b.line, b.language, b.code, b.skip_reason) for b in found] == [
        (2, "python", "a = 1\n", None), (7, "python", "b = 2\n", "needs two ranks"), (10, "bash", "ls\n", None)]
    assert slug("A budget per rank (`budget_scope`)") == "a-budget-per-rank-budget_scope"


def test_the_readme_opens_with_what_remat_is_and_the_two_commands() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    head = lines[:30]
    assert DEMO in head and SUITE in head, "the demo and test commands must stay, unchanged, near the top"
    assert SUITE in (ROOT / ".ci" / "run").read_text(), "CI runs the README's test command"
    first_paragraph = next(line for line in lines[1:] if line.strip())
    assert "rematerialization" in first_paragraph
    assert len(lines) <= 300


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_somewhere(path: Path) -> None:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        assert dest.exists(), f"{path.name}: link to {target} leads nowhere"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), f"{path.name}: no heading #{anchor} in {dest.name}"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # files a block writes land here, not in the checkout
    namespace: dict[str, object] = {"__name__": f"doc_{path.stem}"}
    runnable = [b for b in blocks(path) if b.language == "python" and b.skip_reason is None]
    for block in runnable:
        code = compile(block.code, f"{path.relative_to(ROOT)}:{block.line}", "exec")
        exec(code, namespace)  # noqa: S102 (the documentation's own examples)
