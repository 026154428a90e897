"""Every shell and Python block of the README and of the pages in ``docs/`` runs as written,
except the test command's own block (it is what runs this test). A block that needs a real
cloud account or a GPU says so in the page itself, on the line before it:
``<!-- readme-test: cloud-only: REASON -->`` or ``<!-- readme-test: gpu-only: REASON -->``;
such a block is only compiled (Python) or parsed (``bash -n``). The list of marked blocks is
fixed here, so marking cannot grow unnoticed. A block the page asks to save as a file says so
on the line before it, ``<!-- readme-file: NAME -->``: it runs as that file, and every later
block of the same page finds it in its folder.

The README stays a guide: at most 450 lines, every page of ``docs/`` linked from it, and every
relative link of README and docs leads to a file and heading that exist."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from flow_testing import warning_lines

ROOT = Path(__file__).resolve().parents[1]
_FENCE = re.compile(r"^( *)```(bash|python)\n(.*?)^\1```\n", re.M | re.S)  # also in a list
_MARK = re.compile(r"<!-- readme-test: (cloud-only|gpu-only): (\S.*?) -->\n\Z")
_FILE = re.compile(r"<!-- readme-file: ([\w.-]+) -->\n\Z")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
README_MAX_LINES = 450

# (kind, the block's first line) of every marked block.
MARKED = {
    ("gpu-only", "from flow_sdk import FlowApp, current"),
    ("cloud-only", "@app.function(gpu=\"h100:8\", num_instances=4, provider=\"aws\", priority=\"med\","),
    ("cloud-only", "flow catalog refresh                # today's prices from the AWS Price List API"),
    ("cloud-only", "flow run -y --provider aws --gpu h100:8 -N 4 --max-run-time-hours 12 train.py"),
    ("cloud-only", "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"),
    ("cloud-only", "from flow_sdk import FlowApp, current"),
}


@dataclass(frozen=True)
class Block:
    language: str
    text: str
    page: str  # the page it is in, from the checkout's root: "README.md", "docs/aws.md"
    line: int  # where the block starts in its page
    mark: str | None  # "cloud-only" / "gpu-only", or None: the block runs
    file: str | None  # the file name the page saves it as, or None

    @property
    def first_line(self) -> str:
        return self.text.splitlines()[0]

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[str]:
    """The README and every page of docs/, as paths from the checkout's root."""
    return ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))


def page_blocks(page: str) -> list[Block]:
    text = (ROOT / page).read_text()
    blocks = []
    for match in _FENCE.finditer(text):
        mark = _MARK.search(text[:match.start()])
        file = _FILE.search(text[:match.start()])
        blocks.append(Block(match[2], textwrap.dedent(match[3]), page,
                            text.count("\n", 0, match.start()) + 1, mark[1] if mark else None,
                            file[1] if file else None))
    return blocks


def readme_blocks() -> list[Block]:
    return page_blocks("README.md")


def doc_blocks() -> list[Block]:
    """Every block of the README and of docs/, in page order."""
    return [block for page in pages() for block in page_blocks(page)]


def _test_command() -> str:
    """The README's test command: the one `.ci/run` runs."""
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    return next(line for line in ci if "pytest" in line)


# The rehearsal's two blocks (first lines): tests/sim/test_rehearsal.py runs them as written,
# in a clean environment, and checks what they print and that nothing of them is left.
REHEARSAL = ("import os", "printf 'import os\\nprint(\"rank\", os.environ[\"RANK\"])\\n' > train.py")


def _runnable() -> list[Block]:
    return [b for b in doc_blocks() if b.mark is None and b.text.strip() != _test_command()
            and not (b.page == "README.md" and b.first_line in REHEARSAL)]


def test_the_rehearsal_blocks_are_in_the_readme() -> None:
    firsts = [b.first_line for b in readme_blocks() if b.mark is None]
    assert all(firsts.count(line) == 1 for line in REHEARSAL), REHEARSAL


def test_the_readme_opens_with_the_two_set_up_commands_and_ci_runs_the_second() -> None:
    first, second = readme_blocks()[:2]
    assert first.language == second.language == "bash"
    assert len(first.text.strip().splitlines()) == 1 and "examples/ddp_local.py" in first.text
    assert second.text.strip() == _test_command()


def test_the_marked_blocks_are_exactly_the_known_ones_and_each_gives_a_reason() -> None:
    marked = {(b.mark, b.first_line) for b in doc_blocks() if b.mark}
    assert marked == MARKED
    for page in pages():
        for mark in re.finditer(r"<!-- readme-(?:test|file): (.*?) -->", (ROOT / page).read_text()):
            assert _MARK.match(mark[0] + "\n") or _FILE.match(mark[0] + "\n"), \
                f"{page}: malformed mark: {mark[0]}"


def test_a_saved_file_is_a_block_that_runs_and_later_blocks_use_it() -> None:
    saved = [b for b in doc_blocks() if b.file]
    assert saved and all(b.mark is None and b.language == "python" for b in saved)
    for block in saved:
        later = [b for b in page_blocks(block.page) if b.line > block.line and b.mark is None]
        assert any(Path(block.file).stem in b.text for b in later), f"{block.where}: unused"


def test_the_readme_is_a_guide_of_at_most_450_lines() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines; move reference material to a page in docs/")


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_docs_page_is_linked_from_the_readme_and_every_link_leads_somewhere() -> None:
    readme = (ROOT / "README.md").read_text()
    for page in pages()[1:]:
        assert f"]({page})" in readme or f"]({page}#" in readme, f"README does not link {page}"
    for page in pages():
        for target in _LINK.findall((ROOT / page).read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            path, _, anchor = target.partition("#")
            linked = (ROOT / page).parent / path if path else ROOT / page
            assert linked.exists(), f"{page}: link to {target}: no such file"
            if anchor:
                assert anchor in _anchors(linked), f"{page}: link to {target}: no such heading"


@pytest.mark.parametrize("block", [b for b in doc_blocks() if b.mark], ids=lambda b: b.where)
def test_a_marked_block_is_valid_code(block: Block, tmp_path: Path) -> None:
    if block.language == "python":
        compile(block.text, block.where, "exec")
    else:
        script = tmp_path / "block.sh"
        script.write_text(block.text)
        subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)


def _environment(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    home = tmp_path / "home"
    home.mkdir()
    env.update(HOME=str(home), FLOW_HOME=os.environ["FLOW_HOME"], PYTHONUNBUFFERED="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    return env


def _set_up_venv(tmp_path: Path) -> Path:
    """A virtualenv of its own for the set-up block, so that its install leaves the one this
    suite runs in alone. It sees this environment's packages through a .pth file, pip
    included (so it is made without a pip of its own), and the set-up installs only the SDK
    itself; returns its bin folder."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    site = next((venv / "lib").glob("python3*/site-packages"))
    outer = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    (site / "outer-environment.pth").write_text("".join(f"{p}\n" for p in sorted(outer)))
    return venv / "bin"


@pytest.mark.slow
@pytest.mark.parametrize("block", _runnable(), ids=lambda b: b.where)
def test_a_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    """Each block runs in a fresh folder with a copy of `examples/`, the files its page saved
    before it, and no AWS credentials, except the set-up, which runs in the checkout as the
    README says."""
    work = tmp_path / "work"
    shutil.copytree(ROOT / "examples", work / "examples")
    for saved in page_blocks(block.page):
        if saved.file and saved.line <= block.line:
            (work / saved.file).write_text(saved.text)
    env = _environment(tmp_path)
    cwd = work
    if "scripts/setup.sh" in block.text:
        cwd = ROOT
        env["PATH"] = f"{_set_up_venv(tmp_path)}{os.pathsep}{env['PATH']}"
    if block.language == "python":
        script = work / (block.file or "block.py")
        script.write_text(block.text)
        argv = [sys.executable, str(script)]
    else:
        (work / "block.sh").write_text(block.text)
        argv = ["bash", "-euo", "pipefail", str(work / "block.sh")]
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=420, check=False)
    assert done.returncode == 0, (f"{block.where} exited {done.returncode}\n"
                                  f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


_EPOCH = re.compile(r"\[rank 0\] epoch (\d+): loss=([\d.]+)$", re.M)


@pytest.mark.slow
def test_the_main_job_trains_across_two_nodes_and_rank_0_prints_a_falling_loss(
        tmp_path: Path) -> None:
    """The first command's job as it runs it, from the checkout, in the environment the test
    command's own set-up made (the same script, with ``--dev``). The whole first block, its
    set-up included in a virtualenv of its own, runs in the extended tier."""
    first = readme_blocks()[0].text.strip()
    job = first.split("&&")[-1].split()
    assert job == ["python3", "examples/ddp_local.py"], first
    done = subprocess.run([sys.executable, *job[1:]], cwd=ROOT, env=_environment(tmp_path),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    epochs = [(int(n), float(loss)) for n, loss in _EPOCH.findall(done.stdout)]
    assert [n for n, _ in epochs] == list(range(len(epochs))) and len(epochs) >= 2, done.stdout
    assert epochs[-1][1] < epochs[0][1], done.stdout
    assert "world_size=4 " in done.stdout, done.stdout
    assert not warning_lines(done.stdout + done.stderr), done.stdout + done.stderr


def test_warning_lines_are_python_and_torch_warnings_and_one_is_forgiven_only_without_dns(
        monkeypatch: pytest.MonkeyPatch) -> None:
    unnamed = ("[Node 0] [18:06:38] [W1204 18:06:38.610182369 socket.cpp:207] [c10d] The "
               "hostname of the client socket cannot be retrieved. err=-3")
    other = "[W1204 18:06:39.1 ProcessGroupNCCL.cpp:1] [c10d] something else"
    python = "train.py:3: UserWarning: careful"
    output = "\n".join(["epoch 0: loss=2.0", unnamed, other, python, "[rank 0] W = 3"])

    def the_number(address: tuple[str, int], flags: int) -> tuple[str, str]:
        return address[0], str(address[1])  # what a machine whose name server answers gives

    def no_name_server(address: tuple[str, int], flags: int) -> tuple[str, str]:
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getnameinfo", the_number)
    assert warning_lines(output) == [unnamed, other, python]
    monkeypatch.setattr(socket, "getnameinfo", no_name_server)
    assert warning_lines(output) == [other, python]
