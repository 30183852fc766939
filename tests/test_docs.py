"""Every ```python and ```bash example in README.md and docs/**/*.md runs, as written.

Each fenced block is one test (id: ``file:line``). A block runs in a fresh temporary directory with
this checkout first on ``PYTHONPATH`` and the running interpreter's ``bin/`` first on ``PATH`` (so
``python`` and ``dllm`` are this environment's); bash blocks run under ``set -euo pipefail``. A block
passes when it exits 0 within its time limit.

An HTML comment on the line just above a fence marks the block (docs/contributing.md says how):

    <!-- docs-test: slow -->          a long example: runs under ``pytest -m slow`` only
    <!-- docs-test: skip=hub -->      needs a model from the Hugging Face hub: skipped, reason shown
    <!-- docs-test: skip=gpu -->      needs CUDA: skipped, reason shown
    <!-- docs-test: skip=setup -->    installs packages or runs the test suite itself: not run here;
                                      ``.ci/run`` must run each of its lines verbatim (tested below)

Any other marker is an error, so a typo cannot skip a block silently. Other fence languages
(```text, ```console for output) are not examples and are not run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LANGUAGES = {"python", "bash"}
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[A-Za-z0-9_+-]*)\s*$")
MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<marker>.*?)\s*-->\s*$")
SKIP_REASONS = {
    "hub": "needs a model from the Hugging Face hub",
    "gpu": "needs a CUDA GPU",
    "torch-index": "installs torch from download.pytorch.org (CPU wheel), which CI cannot reach: .ci/run pins torch==2.13.0 from its index instead",
    "setup": "installs packages or runs the test suite: .ci/run runs these lines (test_setup_blocks_run_in_ci)",
}
FAST_LIMIT_S = 180
SLOW_LIMIT_S = 900


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    marker: str | None

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def extract_blocks(page: Path) -> list[Block]:
    """The fenced ```python / ```bash blocks of one Markdown page, with the marker above each."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang, indent = i, m["lang"], len(m["indent"])
        j = i + 1
        while j < len(lines) and not re.match(rf"^ {{{indent}}}```\s*$", lines[j]):
            j += 1
        if j == len(lines):
            raise ValueError(f"{page}:{start + 1}: fence ``` never closed")
        if lang in LANGUAGES:
            k = start - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            mm = MARKER.match(lines[k]) if k >= 0 else None
            code = "\n".join(line[indent:] for line in lines[start + 1:j]) + "\n"
            blocks.append(Block(page, start + 1, lang, code, mm["marker"] if mm else None))
        i = j + 1
    return blocks


BLOCKS = [b for page in PAGES for b in extract_blocks(page)]


def _param(block: Block):
    marks = []
    if block.marker == "slow":
        marks.append(pytest.mark.slow)
    elif block.marker is not None and block.marker.startswith("skip="):
        reason = SKIP_REASONS.get(block.marker[len("skip="):])
        if reason is not None:
            marks.append(pytest.mark.skip(reason=f"{block.id}: {reason}"))
    return pytest.param(block, id=block.id, marks=marks)


def _check_marker(block: Block) -> None:
    valid = {"slow", *(f"skip={k}" for k in SKIP_REASONS)}
    if block.marker is not None and block.marker not in valid:
        raise AssertionError(f"{block.id}: unknown docs-test marker {block.marker!r}; valid: {sorted(valid)}")


def test_examples_found() -> None:
    """The collector sees the pages' examples (a broken fence regex would pass every page vacuously)."""
    assert len(BLOCKS) >= 10, [b.id for b in BLOCKS]
    assert any(b.page.name == "README.md" and b.marker is None for b in BLOCKS)
    for block in BLOCKS:
        _check_marker(block)


def test_extract_blocks_reads_markers(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("text\n\n<!-- docs-test: slow -->\n```bash\necho hi\n```\n\n```text\nnot run\n```\n"
                    "- item:\n\n  ```python\n  print(1)\n  ```\n")
    blocks = extract_blocks(page)
    assert [(b.line, b.lang, b.code, b.marker) for b in blocks] == [
        (4, "bash", "echo hi\n", "slow"), (13, "python", "print(1)\n", None)]


def test_setup_blocks_run_in_ci() -> None:
    """The README's install and test commands are what CI runs, line for line."""
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    setup = [b for b in BLOCKS if b.marker == "skip=setup"]
    assert setup, "README.md has no setup block"
    for block in setup:
        for line in block.code.splitlines():
            command = line.split("  #", 1)[0].strip()
            if command and not command.startswith("#"):
                assert command in ci, f"{block.id}: {command!r} is not in .ci/run"


@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS])
def test_example_runs(block: Block, tmp_path: Path) -> None:
    _check_marker(block)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("MPLBACKEND", "Agg")
    if block.lang == "python":
        script = tmp_path / "example.py"
        script.write_text(block.code, encoding="utf-8")
        argv = [sys.executable, str(script)]
    else:
        argv = ["bash", "-euo", "pipefail", "-c", block.code]
    limit = SLOW_LIMIT_S if block.marker == "slow" else FAST_LIMIT_S
    try:
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.id}: still running after {limit} s (mark it <!-- docs-test: slow --> or shorten it)")
    if proc.returncode != 0:
        pytest.fail(f"{block.id}: exit {proc.returncode}\n--- code\n{block.code}--- stdout (tail)\n"
                    f"{proc.stdout[-3000:]}\n--- stderr (tail)\n{proc.stderr[-3000:]}")


README_MAX_LINES = 300
INLINE_CODE = re.compile(r"`([^`\n]+)`")
DLLM_WORDS = re.compile(r"(?:^|[\s(;|&])dllm((?: +[^\s`#]+){0,3})")
PYTHON_M = re.compile(r"(?:python3? )?-m (dllm[\w.]*)")
PYTHON_M_ALLOWED = {"dllm", "dllm.train", "dllm.eval.harness"}  # the CLI itself, its train alias, lm-eval's own CLI


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"


def test_readme_names_the_caches_that_take_refresh() -> None:
    """The README's line on ``refresh=k`` names exactly the registered cache policies whose Config has
    ``refresh`` (it said "Every policy takes `refresh=k`", which ``drift``, ``block``, ``subblock`` and
    ``none`` refuse)."""
    import dataclasses

    from dllm.cache import caches

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"^([^|\n]*?) takes? `refresh=k`", text, re.M)
    assert m, "README.md no longer says which caches take `refresh=k`"
    named = set(re.findall(r"`(\w+)`", m[1]))
    have = {n for n in caches.names() if "refresh" in {f.name for f in dataclasses.fields(caches.get(n).Config)}}
    assert named == have, f"README names {sorted(named)}; the policies with refresh are {sorted(have)}"


def _table_width(row: str) -> int:
    """Cells of a Markdown table row (a ``|`` inside code spans or escaped as ``\\|`` does not split)."""
    bare = re.sub(r"`[^`]*`", "x", row.strip()).replace("\\|", "")
    return bare.strip("|").count("|") + 1


def bad_table_rows(text: str) -> list[str]:
    """Rows of the Markdown tables of ``text`` whose cell count differs from their header's."""
    lines, bad, i = text.splitlines(), [], 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.fullmatch(r"\|[-:| ]+\|", lines[i + 1].strip()):
            width, i = _table_width(lines[i]), i + 2
            while i < len(lines) and lines[i].startswith("|"):
                cells = _table_width(lines[i])
                if cells != width:
                    bad.append(f"line {i + 1}: {cells} cells, the header {width}: {lines[i][:60]}")
                i += 1
        else:
            i += 1
    return bad


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_table_row_has_its_header_s_cells(page: Path) -> None:
    """A row of another table pasted into one renders as a broken row (README's drafters table held
    three rows of a 10-column results table)."""
    assert bad_table_rows(page.read_text(encoding="utf-8")) == []


def test_the_table_check_sees_a_stray_row() -> None:
    table = "| a | b |\n|---|---|\n| `x|y` | 2 |\n| 1 | 2 | 3 |\n"
    assert len(bad_table_rows(table)) == 1 and "3 cells" in bad_table_rows(table)[0]


def _code_texts(page: Path) -> list[str]:
    """The page's shell text: every fenced bash block and every inline code span."""
    text = page.read_text(encoding="utf-8")
    return [b.code for b in extract_blocks(page) if b.lang == "bash"] + INLINE_CODE.findall(text)


def _unknown_commands(line: str) -> list[str]:
    """The registry's error for each ``dllm <words>`` of one line of shell text it does not resolve
    (``dllm/cli/table.py``); the CLI itself, a placeholder and a group's own listing pass."""
    from dllm.cli.registry import UsageError
    from dllm.cli.table import REGISTRY

    errors = []
    for m in DLLM_WORDS.finditer(line):
        raw = m[1].split()
        if not raw or raw[0].startswith(("-", "<", "$", "...")):
            continue  # `dllm --help`, `dllm <group> <command>`, `--model dllm ...`
        words = [w.strip("`").rstrip(":;,.)") for w in raw]
        if words[0] in REGISTRY.groups and (len(words) == 1 or words[1] in ("-h", "--help")):
            continue  # `dllm bench`, `dllm bench --help`: the group's list of commands
        try:
            REGISTRY.find(words)
        except UsageError as err:
            errors.append(f"dllm {' '.join(words)}: {err}")
    return errors


def test_every_dllm_command_shown_is_registered() -> None:
    """Each ``dllm <words>`` in the pages' commands names a command of the registry (``dllm/cli/table.py``),
    and ``python -m`` appears only for lm-eval's harness, ``dllm.train`` and ``dllm`` itself: a command that
    moves or is renamed fails here, not in a reader's shell."""
    bad = []
    for page in PAGES:
        for text in _code_texts(page):
            for line in text.splitlines():
                line = line.split(" #", 1)[0]
                bad += [f"{page.relative_to(ROOT)}: {line.strip()!r}: {err}" for err in _unknown_commands(line)]
                for target in PYTHON_M.findall(line):
                    if target not in PYTHON_M_ALLOWED:
                        bad.append(f"{page.relative_to(ROOT)}: {line.strip()!r}: python -m {target} "
                                   f"(show the dllm command)")
    assert not bad, "\n".join(bad)


SCRIPTS = sorted((ROOT / "benchmarks").glob("*.sh"))
SCRIPT_FILE = re.compile(r"python3? (benchmarks/[\w./-]+\.py)")


def _stale_in_script(script: Path) -> list[str]:
    """The commands of a shell script that no longer exist: a ``dllm <words>`` the registry does not
    know, a ``python -m <module>`` that cannot be imported, a ``python benchmarks/<file>.py`` that is
    not there. Comments are read too (they tell a reader what to run)."""
    bad = []
    for n, line in enumerate(script.read_text(encoding="utf-8").splitlines(), 1):
        where = f"{script.name}:{n}"
        bad += [f"{where}: {err}" for err in _unknown_commands(line)]
        for target in PYTHON_M.findall(line):
            if not _is_module(target):
                bad.append(f"{where}: python -m {target}: no such module")
        for path in SCRIPT_FILE.findall(line):
            if not (ROOT / path).is_file():
                bad.append(f"{where}: {path}: no such file")
    return bad


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_command_of_a_benchmark_script_exists(script: Path) -> None:
    """The benchmark scripts that CI does not run end to end (``embedded-models.sh`` takes hours) rot
    silently when a command moves: each command they name must still exist."""
    bad = _stale_in_script(script)
    assert not bad, "\n".join(bad)


def _is_module(name: str) -> bool:
    """Whether ``name`` is an importable module (False for a name inside a module that is not a package)."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.parametrize("script", sorted((ROOT / "benchmarks").glob("*.py")), ids=lambda p: p.name)
def test_every_dllm_import_of_a_benchmark_script_resolves(script: Path) -> None:
    """``from dllm.x import y`` in a benchmark script names a module that imports and a ``y`` it has
    (or a submodule): a module that moves fails here, not on the next run of a script CI never runs."""
    import ast
    import importlib

    bad = []
    for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "dllm":
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name) and not _is_module(f"{node.module}.{alias.name}"):
                    bad.append(f"{script.name}:{node.lineno}: from {node.module} import {alias.name}")
        elif isinstance(node, ast.Import):
            bad += [f"{script.name}:{node.lineno}: import {a.name}" for a in node.names
                    if a.name.split(".")[0] == "dllm" and not _is_module(a.name)]
    assert not bad, "\n".join(bad)


def test_the_script_check_sees_a_stale_command(tmp_path: Path) -> None:
    script = tmp_path / "s.sh"
    script.write_text("dllm eval tasks --k 1\npython -m dllm.eval.choose_fast --results x\n"
                      "dllm bench nonsense\npython3 benchmarks/gone.py\n")
    message = "\n".join(_stale_in_script(script))
    assert "choose_fast" in message and "bench nonsense" in message and "gone.py" in message
    assert "eval tasks" not in message


def test_the_command_check_sees_a_stale_command(tmp_path: Path, monkeypatch) -> None:
    page = tmp_path / "p.md"
    page.write_text("Run `dllm eval-tasks --k 1` and `dllm bench nonsense`, or `python -m dllm.eval.choose_fast`.\n")
    monkeypatch.setattr(sys.modules[__name__], "PAGES", [page])
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    with pytest.raises(AssertionError) as err:
        test_every_dllm_command_shown_is_registered()
    message = str(err.value)
    assert "bench nonsense" in message and "dllm.eval.choose_fast" in message and "eval-tasks" not in message
