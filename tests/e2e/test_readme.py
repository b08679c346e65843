"""The README's promises, run as written.

* The first two lines of the first code block are the set-up contract: line 1 installs and splits a sample
  model, line 2 installs the test extra and runs the tests.  The ``onnxpipe ...`` command of line 1 is run
  through the installed console script in a temporary copy of the repository's files (the install itself
  is what this virtual environment already did); line 2's extra must exist and hold what the tests import.
* The CLI block (``split``, ``inspect``, ``verify``) runs in order in that copy.
* The Python block runs (``exec``) in a temporary working folder, with the sample model's path adjusted,
  and so does the one-liner ``onnxpipe.split("model.onnx", 3, "stages/")``.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from paths import REPO_ROOT

import onnxpipe

README = REPO_ROOT / "README.md"


def code_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of every fenced block, in order."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S)]


def setup_lines() -> list[str]:
    _lang, body = code_blocks(README.read_text())[0]
    lines = [line for line in body.splitlines() if line.strip()]
    assert len(lines) >= 2, "the README's first block must hold the two set-up lines"
    return lines[:2]


def onnxpipe_command(line: str) -> list[str]:
    """The ``onnxpipe ...`` part of a ``pip install ... && onnxpipe ...`` line, as argv."""
    parts = [p.strip() for p in line.split("&&")]
    commands = [shlex.split(p) for p in parts if p.startswith("onnxpipe ")]
    assert len(commands) == 1, f"expected one onnxpipe command in {line!r}"
    return commands[0]


def console_script() -> Path:
    script = Path(sys.executable).parent / "onnxpipe"
    if script.is_file():
        return script
    found = shutil.which("onnxpipe")
    if found is None:
        pytest.skip("the onnxpipe console script is not installed (pip install .)")
    return Path(found)


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    """What a user has after cloning: the tracked files the commands read (README, sample models, docs)."""
    copy = tmp_path / "onnxpipe"
    copy.mkdir()
    for name in ("README.md", "pyproject.toml"):
        shutil.copy(REPO_ROOT / name, copy / name)
    for folder in ("sample_models", "docs"):
        shutil.copytree(REPO_ROOT / folder, copy / folder)
    return copy


def with_out(argv: list[str], out: Path) -> list[str]:
    """``argv`` with the value of ``--out`` replaced by ``out``."""
    i = argv.index("--out")
    return [*argv[: i + 1], str(out), *argv[i + 2 :]]


def test_first_line_installs_and_splits(repo_copy: Path, tmp_path: Path) -> None:
    line = setup_lines()[0]
    assert line.startswith("pip install . && ")
    argv = onnxpipe_command(line)
    assert argv[:2] == ["onnxpipe", "split"]
    model = repo_copy / argv[2]
    assert model.is_file(), f"the README splits {argv[2]}, which the repository does not have"
    out = tmp_path / "stages"
    proc = subprocess.run(
        [str(console_script()), *with_out(argv, out)[1:]],
        cwd=repo_copy,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    asked = argv[argv.index("--stages") + 1]
    manifest = onnxpipe.load_manifest(out)
    k = manifest.k if asked == "auto" else int(asked)
    assert manifest.k == k and f"wrote {k} stages" in proc.stdout
    assert "match the original" in proc.stdout
    # the quick start fits the machine it runs on (a busy machine's own warning aside: others' load)
    warned = [x for x in proc.stdout.splitlines() if x.startswith("warning:") and "other processes" not in x]
    assert warned == []
    assert onnxpipe.verify(out).ok
    # the model path recorded in the manifest leads back to the copy's model
    assert (out / manifest.source.path).resolve() == model.resolve()  # type: ignore[operator]


def test_first_line_as_written_in_the_copy(repo_copy: Path) -> None:
    """The command exactly as printed (relative ``--out stages/``) from the copy's root."""
    argv = onnxpipe_command(setup_lines()[0])
    proc = subprocess.run(
        [str(console_script()), *argv[1:]], cwd=repo_copy, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    out = repo_copy / argv[argv.index("--out") + 1]
    assert (out / "manifest.json").is_file()
    assert sorted(p.name for p in repo_copy.iterdir()) == sorted(
        ["README.md", "pyproject.toml", "sample_models", "docs", out.name]
    )


def _imported_top_level_modules(folder: Path) -> set[str]:
    names: set[str] = set()
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return names


def test_second_line_installs_what_the_tests_need() -> None:
    line = setup_lines()[1]
    assert line == "pip install '.[test]' && pytest"
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    requirement = re.compile(r"^([A-Za-z0-9_.-]+)")
    dists = {requirement.match(r).group(1).lower() for r in project["dependencies"]}  # type: ignore[union-attr]
    dists |= {requirement.match(r).group(1).lower() for r in project["optional-dependencies"]["test"]}  # type: ignore[union-attr]
    assert "pytest" in dists
    # third-party modules the tests import must come with the install (module name -> distribution)
    dist_of = {"yaml": "pyyaml", "google": "protobuf", "numpy": "numpy"}
    provided_by_deps = {"google", "numpy"}  # protobuf arrives with onnx
    stdlib = set(sys.stdlib_module_names)
    local = {"onnxpipe", "tools", "tests", "benchmarks"} | {
        p.stem for p in (REPO_ROOT / "tests").glob("*.py")
    }
    imported = _imported_top_level_modules(REPO_ROOT / "tests") - stdlib - local - provided_by_deps
    # the optional extras (ray, plotting) are imported behind importorskip: allowed to be absent
    optional = {d.lower() for extra in project["optional-dependencies"].values() for d in extra}
    optional_names = {requirement.match(d).group(1).lower() for d in optional}  # type: ignore[union-attr]
    missing = sorted(m for m in imported if dist_of.get(m, m).replace("_", "-") not in dists | optional_names)
    assert not missing, f"tests import {missing}, which pip install '.[test]' does not install"


def python_blocks() -> str:
    """Every Python example of the README, in order: they run as one script (later ones use names the
    first defines)."""
    blocks = [body for lang, body in code_blocks(README.read_text()) if lang == "python"]
    assert blocks, "expected a Python example in the README"
    return "\n".join(blocks)


def ignored_folders() -> set[str]:
    """The top-level folders the repository's ``.gitignore`` ignores by name (``stages/``, ``/x/``)."""
    names = set()
    for line in (REPO_ROOT / ".gitignore").read_text().splitlines():
        name = line.strip().removeprefix("/")
        if name.endswith("/") and "/" not in name[:-1] and not any(c in name for c in "*?[!#"):
            names.add(name[:-1])
    return names


def run_example(how: str, code: str, folder: Path) -> None:
    """Run the README's Python example as a user would, in ``folder`` (where ``sample_models`` is the
    repository's): ``script`` saved as a file and run, ``stdin`` piped to ``python -``.  Both keep the
    caller's ``__main__`` unguarded, which the process workers of ``run(compare=True)`` must not import."""
    env = dict(os.environ)
    tree = str(Path(onnxpipe.__file__).resolve().parent.parent)  # the onnxpipe these tests import
    env["PYTHONPATH"] = os.pathsep.join(p for p in (tree, env.get("PYTHONPATH")) if p)
    if how == "script":
        script = folder / "readme_example.py"
        script.write_text(code)
        argv, stdin = [sys.executable, str(script)], None
    else:
        argv, stdin = [sys.executable, "-"], code
    proc = subprocess.run(argv, cwd=folder, input=stdin, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"the README's Python example ({how}) failed:\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize(
    "runs",
    [("script",), pytest.param(("script", "script", "stdin"), marks=pytest.mark.exhaustive)],
)
def test_python_example_runs(tmp_path: Path, runs: tuple[str, ...]) -> None:
    """The README's Python example runs as a script; the exhaustive lane runs it again (replacing what the
    first run wrote, as a user running it again would) and from standard input."""
    code = python_blocks()
    assert "__main__" not in code, "the README's example must run as people run examples, unguarded"
    samples = set(re.findall(r'"(sample_models/[\w./]+\.onnx)"', code))
    assert samples, "the Python example names no sample model"
    assert all((REPO_ROOT / sample).is_file() for sample in samples)
    (tmp_path / "sample_models").symlink_to(REPO_ROOT / "sample_models", target_is_directory=True)
    for how in runs:
        run_example(how, code, tmp_path)
        assert (tmp_path / "stages" / "manifest.json").is_file()
    written = {p.name for p in tmp_path.iterdir()} - {"sample_models", "readme_example.py"}
    stray = sorted(written - ignored_folders())
    assert not stray, f"the example writes {stray} into the clone, which .gitignore does not ignore"


def test_all_at_once_one_liner_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = README.read_text()
    m = re.search(r"`(onnxpipe\.split\([^`]*\))`", text)
    assert m is not None, "the README's all-at-once call is gone"
    call = m.group(1)
    shutil.copy(REPO_ROOT / "sample_models" / "transformer_tiny.onnx", tmp_path / "model.onnx")
    monkeypatch.chdir(tmp_path)
    result = eval(call, {"onnxpipe": onnxpipe})
    assert result.report is not None and result.report.ok
    assert (tmp_path / "stages" / "manifest.json").is_file()


def test_cli_block_runs_in_order(repo_copy: Path) -> None:
    blocks = [body for lang, body in code_blocks(README.read_text()) if lang == ""]
    cli = next(b for b in blocks if b.lstrip().startswith("$ onnxpipe"))
    commands = [shlex.split(line[2:]) for line in cli.splitlines() if line.startswith("$ ")]
    assert [c[1] for c in commands] == ["split", "inspect", "verify", "run"]
    for argv in commands:
        proc = subprocess.run(
            [str(console_script()), *argv[1:]], cwd=repo_copy, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, f"{shlex.join(argv)}: {proc.stderr}"
