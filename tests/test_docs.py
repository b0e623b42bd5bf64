"""Every fenced ```python and ```bash block of README.md and docs/*.md is executed.

A reader follows one page from top to bottom, so the blocks of one page run in order, in one
Python namespace and one working folder (a fresh temporary copy of ``examples/``, next to a
link to ``../shared`` when that exists). Bash blocks run with ``bash -e -o pipefail`` and the
``pdpfl`` of this interpreter first on ``PATH``.

A block that needs a network, a multi-host deployment or minutes of compute carries
``<!-- no-run: reason -->`` on the line before its fence; it is skipped and listed with its
reason in the test summary (``-ra``). Keep these few (see :data:`MAX_NO_RUN`).

Blocks that are known to fail on this branch and are fixed by another branch are listed in
:data:`KNOWN_BROKEN` by a hash of their exact text: they are expected to fail (a strict xfail: a
listed block that passes fails the test so the entry gets removed), and any edit of the block
makes it run for real again.

Blocks that read the real datasets (``../shared/data``) skip with that reason when the folder is
absent (a clone without the datasets), unless they guard themselves with ``[ -d ../shared/data``;
a later block of the same page that then fails is skipped with the same reason (it likely needed
the earlier block's outputs).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Upper bound on ``no-run`` exceptions over all pages.
MAX_NO_RUN = 10
#: Seconds one bash block may take.
BASH_TIMEOUT = 600

_FENCE = re.compile(r"^```(\w*)\s*$")
_NO_RUN = re.compile(r"^<!--\s*no-run(?::\s*(.*?))?\s*-->\s*$")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


#: sha256[:12] of a block's text -> why it fails here and which branch fixes it (issue #17).
KNOWN_BROKEN: dict[str, str] = {}

#: Blocks not even started on this branch: they run a multi-process Flower federation (minutes
#: under load) and carry no ``no-run`` marker yet; their owner's edit of the page (a marker or a
#: faster block) replaces these entries.
NOT_RUN_HERE: dict[str, str] = {}


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    no_run: str | None  # reason, or None when the block runs

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def parse_blocks(page: Path) -> list[Block]:
    """The ```python / ```bash blocks of ``page`` with their ``no-run`` markers."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1).lower()
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        if lang in ("python", "bash"):
            marker = _NO_RUN.match(lines[start - 1].strip()) if start else None
            reason = None
            if marker:
                reason = (marker.group(1) or "").strip()
            blocks.append(
                Block(page, start + 1, lang, "\n".join(lines[start + 1 : j]) + "\n", reason)
            )
        i = j + 1
    return blocks


ALL_BLOCKS = [b for page in PAGES for b in parse_blocks(page)]


@dataclass
class Outcome:
    status: str  # ok | fail | skip
    detail: str = ""
    seconds: float = 0.0
    cpu_seconds: float = 0.0


_RESULTS: dict[Path, dict[int, Outcome]] = {}

#: ``../shared/data`` beside the checkout (the real datasets; absent in a bare clone).
SHARED_DATA = ROOT.parent / "shared" / "data"
_GUARDED = re.compile(r"\[\s+-[de]\s+\S*shared/data")


def data_skip_reason(text: str, data_dir: Path) -> str | None:
    """Why a block that reads ``../shared/data`` cannot run here (None when it can)."""
    if "shared/data" not in text or _GUARDED.search(text) or data_dir.is_dir():
        return None
    return f"needs the shared datasets, not found at {data_dir} (CI provides ../shared/data)"


def _workspace(tmp: Path) -> Path:
    """A fresh folder holding a copy of ``examples/`` (and ``../shared`` linked beside it)."""
    cwd = tmp / "repo"
    cwd.mkdir(parents=True)
    shutil.copytree(ROOT / "examples", cwd / "examples")
    shared = ROOT.parent / "shared"
    if shared.is_dir():
        (tmp / "shared").symlink_to(shared, target_is_directory=True)
    return cwd


def _env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(ROOT / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    env["COLUMNS"] = "80"
    env["MPLBACKEND"] = "Agg"
    return env


def _run_python(block: Block, namespace: dict, cwd: Path) -> Outcome:
    before = os.getcwd()
    out = io.StringIO()
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            exec(compile(block.text, block.id, "exec", dont_inherit=True), namespace)  # noqa: S102 - our docs
    except BaseException:  # noqa: BLE001 - report any failure of a documented snippet
        return Outcome(
            "fail",
            traceback.format_exc(limit=6) + out.getvalue()[-2000:],
            time.perf_counter() - t0,
            time.process_time() - c0,
        )
    finally:
        os.chdir(before)
    return Outcome("ok", out.getvalue()[-2000:], time.perf_counter() - t0, time.process_time() - c0)


def _children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run_bash(block: Block, cwd: Path) -> Outcome:
    t0, c0 = time.perf_counter(), _children_cpu()
    try:
        res = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", block.text],
            cwd=cwd,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=BASH_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return Outcome("fail", f"timed out after {BASH_TIMEOUT} s", time.perf_counter() - t0)
    detail = (res.stdout + res.stderr)[-3000:]
    status = "ok" if res.returncode == 0 else "fail"
    return Outcome(
        status, f"exit {res.returncode}\n{detail}", time.perf_counter() - t0, _children_cpu() - c0
    )


def run_page(page: Path, tmp: Path, data_dir: Path = SHARED_DATA) -> dict[int, Outcome]:
    """Run every block of ``page`` in order (cached: one run per page per session)."""
    if page in _RESULTS:
        return _RESULTS[page]
    import matplotlib

    matplotlib.use("Agg")
    cwd = _workspace(tmp)
    namespace: dict = {"__name__": "__docs__"}
    results: dict[int, Outcome] = {}
    missing_data: str | None = None  # set once a block of this page skipped for the datasets
    for block in parse_blocks(page):
        no_data = data_skip_reason(block.text, data_dir)
        if block.no_run is not None:
            results[block.line] = Outcome("skip", block.no_run)
        elif _digest(block.text) in NOT_RUN_HERE:
            results[block.line] = Outcome("skip", NOT_RUN_HERE[_digest(block.text)])
        elif no_data is not None:
            results[block.line] = Outcome("skip", no_data)
            missing_data = no_data
        else:
            if block.lang == "python":
                outcome = _run_python(block, namespace, cwd)
            else:
                outcome = _run_bash(block, cwd)
            if outcome.status == "fail" and missing_data is not None:
                outcome = Outcome("skip", f"an earlier block of this page {missing_data}")
            results[block.line] = outcome
    _RESULTS[page] = results
    return results


@pytest.mark.slow
@pytest.mark.parametrize("block", ALL_BLOCKS, ids=[b.id for b in ALL_BLOCKS])
def test_documented_block_runs(block: Block, tmp_path_factory: pytest.TempPathFactory) -> None:
    outcome = run_page(block.page, tmp_path_factory.mktemp(block.page.stem))[block.line]
    if outcome.status == "skip":
        pytest.skip(f"{block.id} not run: {outcome.detail}")
    known = KNOWN_BROKEN.get(_digest(block.text))
    if known is not None:
        if outcome.status == "ok":
            pytest.fail(f"{block.id} now runs: remove its KNOWN_BROKEN entry ({known})")
        pytest.xfail(known)
    assert outcome.status == "ok", f"{block.id} ({block.lang}) failed:\n{outcome.detail}"


def test_no_run_blocks_are_few_and_say_why() -> None:
    skipped = [b for b in ALL_BLOCKS if b.no_run is not None]
    assert all(b.no_run for b in skipped), [b.id for b in skipped if not b.no_run]
    # Blocks another test executes (e.g. the Flower deployment steps, run by their markers)
    # are not unrun: the named test file must exist and hold the page's markers.
    elsewhere = [b for b in skipped if b.no_run.startswith("executed by tests/")]
    for b in elsewhere:
        test_file = ROOT / b.no_run.split()[2]
        assert test_file.is_file(), f"{b.id}: {test_file} does not exist"
        assert "deploy:" in test_file.read_text(), f"{b.id}: {test_file} runs no doc markers"
    unrun = [b for b in skipped if b not in elsewhere]
    assert len(unrun) <= MAX_NO_RUN, [b.id for b in unrun]


def test_known_broken_entries_name_existing_blocks() -> None:
    """A stale entry (its block was edited or removed) must go."""
    digests = {_digest(b.text) for b in ALL_BLOCKS}
    stale = sorted(set(KNOWN_BROKEN) | set(NOT_RUN_HERE) - digests)
    assert not [k for k in stale if k not in digests], stale


def test_parser_finds_blocks_and_markers(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        "text\n```python\nx = 1\n```\n<!-- no-run: needs a GPU -->\n```bash\nexit 1\n```\n"
        "```text\nnot code\n```\n```\nplain\n```\n"
    )
    blocks = parse_blocks(page)
    assert [(b.lang, b.line, b.no_run) for b in blocks] == [
        ("python", 2, None),
        ("bash", 6, "needs a GPU"),
    ]
    assert blocks[0].text == "x = 1\n"


def test_blocks_that_need_absent_datasets_skip_with_the_reason(tmp_path: Path) -> None:
    """A clone without ``../shared/data``: the blocks reading it, and later blocks of the page
    that then fail, skip with the reason; blocks that do not need the data still run."""
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\necho ok > independent.txt\n```\n\n"
        "```bash\ncp ../shared/data/x.csv out.csv\n```\n\n"
        "```bash\ncat out.csv\n```\n\n"
        "```bash\nif [ -d ../shared/data ]; then echo yes; else echo no; fi\n```\n",
        encoding="utf-8",
    )
    absent = tmp_path / "nowhere" / "data"
    results = run_page(page, tmp_path / "ws", data_dir=absent)
    first, data, after, guarded = (results[line] for line in sorted(results))
    assert first.status == "ok"
    assert data.status == "skip" and str(absent) in data.detail
    assert after.status == "skip" and "earlier block" in after.detail
    assert guarded.status == "ok"
    present = tmp_path / "present"
    present.mkdir()
    assert data_skip_reason("pdpfl run x.yaml --data-dir ../shared/data", present) is None
    assert data_skip_reason("pdpfl run x.yaml --data-dir ../shared/data", absent) is not None
    assert data_skip_reason("print(1)", absent) is None
