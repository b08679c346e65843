"""The ``onnxpipe`` command: every subcommand, documented exit codes, one-line errors, nothing half-written.

Everything runs through :func:`onnxpipe.cli.main` in-process, and once through the installed console script
in a subprocess.  The exit codes asserted here are the table in ``docs/cli.md`` (the table itself is
checked against the error classes), and every refused request must leave the file system as it was: no
output folder, no temporary folder, the old contents of an existing folder intact.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_runner import no_leftovers, one_line_error, preamble_only, run, run_with_file_size_limit, snapshot
from manifest_edits import sealed
from onnx import TensorProto, helper, numpy_helper
from paths import DEVICES

import onnxpipe
from onnxpipe.cli import main
from onnxpipe.core.files import file_sha256
from onnxpipe.manifest import SCHEMA_VERSION

MLP_NODES = 11  # compute nodes of sample_models/mlp.onnx


def rehash(out: Path, stage: int) -> None:
    """Record stage ``stage``'s current sha256 in the manifest, as if the export had written it."""
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["stages"][stage]["sha256"] = file_sha256(out / f"stage_{stage}.onnx")
    (out / "manifest.json").write_text(sealed(manifest))


def split_ok(model: Path, out: Path, k: int = 3, *extra: str) -> None:
    assert main(["split", str(model), "--stages", str(k), "--out", str(out), "--cost", "static", *extra]) == 0


def test_profile_split_inspect_verify(mlp: Path, work: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["profile", mlp, "--out", "p.json", "--runs", "3", "--warmup", "1"], capfd)
    # stderr is not a terminal here: progress is a plain line with its unit and time, no redrawn bar
    said = r"profiled mlp\.onnx: 1 warm-up run\(s\), then 3 timed twice: with onnxruntime's .*\(\d+\.\d s\)\n"
    assert code == 0 and re.fullmatch(said, err), err
    code, _, err = run(["profile", mlp, "--out", "q.json", "--runs", "3", "--warmup", "1", "-q"], capfd)
    assert code == 0 and err == ""
    lines = out.splitlines()
    # the guessed dim is named, with the flag that sets it, before the work; the total time after it
    assert lines[0] == "input x: float32 [batch, 64] -> run at 1x64 (guessed batch=1)"
    assert "--shape x=1,64" in lines[1]
    assert f"profiled {MLP_NODES} nodes of mlp.onnx" in out and "saved p.json" in out
    assert re.fullmatch(r"profiled in \d+\.\d s", lines[-1])
    assert onnxpipe.Profile.load(work / "p.json").model_sha256 == file_sha256(mlp)

    code, out, err = run(["profile", mlp, "--out", "s.json", "--cost", "static"], capfd)
    assert code == 0 and "(static, 1 thread(s))" in out

    code, out, err = run(["split", mlp, "--stages", "3", "--out", "stages", "--profile", "p.json"], capfd)
    assert code == 0, err
    assert "wrote 3 stages to stages/" in out and "verify: 1 output(s) match the original" in out
    assert sorted(p.name for p in (work / "stages").iterdir()) == [
        "manifest.json",
        "stage_0.onnx",
        "stage_1.onnx",
        "stage_2.onnx",
    ]

    code, out, err = run(["inspect", "stages"], capfd)
    assert code == 0 and err == ""
    assert out.splitlines()[0].split()[:3] == ["stage", "device", "nodes"] and "3 stages" in out

    code, out, err = run(["inspect", mlp], capfd)
    assert code == 0 and f"mlp.onnx: {MLP_NODES} nodes" in out

    code, out, err = run(["verify", "stages", "--seed", "3", "--shape", "x=4,64"], capfd)
    assert code == 0 and err == ""
    assert any(line.startswith("verify: 1 output(s) match the original") for line in out.splitlines())

    code, out, err = run(
        ["split", mlp, "-k", "2", "--out", "nv", "--no-verify", "--quiet", "--cost", "static"], capfd
    )
    assert code == 0 and "verify:" not in out and (work / "nv" / "manifest.json").is_file()


def test_split_options_reach_the_manifest(mlp: Path, work: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(
        ["split", mlp, "-k", "2", "--out", "o", "--cost", "static", "--bandwidth", "1e9",
         "--external-data", "always", "--threads", "2", "--shape", "x=2,64"],
        capfd,
    )  # fmt: skip
    assert code == 0, err
    manifest = onnxpipe.load_manifest(work / "o")
    assert manifest.plan.bandwidth_bytes_per_s == 1e9
    assert dict(manifest.plan.profiled_input_shapes) == {"x": (2, 64)}
    assert all(s.external_data == f"stage_{s.index}.onnx.data" for s in manifest.stages)


def test_threads_reach_the_manifest_with_static_costs(
    mlp: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Regression: --threads was silently dropped with --cost static (the manifest said 1)."""
    code, _, err = run(["split", mlp, "-k", "2", "--out", "o", "--cost", "static", "--threads", "2"], capfd)
    assert code == 0, err
    assert onnxpipe.load_manifest(work / "o").plan.threads == 2


def test_console_script(mlp: Path, tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "onnxpipe"
    if not script.is_file():
        found = shutil.which("onnxpipe")
        if found is None:
            pytest.skip("the onnxpipe console script is not installed (pip install -e .)")
        script = Path(found)
    version = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=120)
    assert version.returncode == 0 and version.stdout.strip() == f"onnxpipe {onnxpipe.__version__}"

    ok = subprocess.run(
        [script, "split", mlp, "--stages", "2", "--out", tmp_path / "out", "--cost", "static"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "wrote 2 stages" in ok.stdout and (tmp_path / "out" / "manifest.json").is_file()

    bad = subprocess.run(
        [script, "split", tmp_path / "missing.onnx", "--stages", "2", "--out", tmp_path / "out2"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert bad.returncode == 3 and bad.stdout == ""
    line = one_line_error(bad.stderr, "split")
    assert "missing.onnx: no such file" in line
    assert not (tmp_path / "out2").exists()

    # a reader that leaves early (`onnxpipe inspect ... | head -1`): no traceback, the SIGPIPE exit code
    proc = subprocess.Popen(
        [script, "inspect", mlp], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.close()  # before the child writes: its first write meets a closed pipe
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141 and "Traceback" not in err, err

    usage = subprocess.run(
        [script, "split", mlp, "--out", tmp_path / "out3"], capture_output=True, text=True, timeout=300
    )
    assert usage.returncode == 2 and usage.stdout == ""
    line = one_line_error(usage.stderr, "split")
    assert line.endswith("required: --stages/-k; see 'onnxpipe split --help'")
    assert not (tmp_path / "out3").exists()


def test_the_time_printed_counts_from_the_process_start(mlp: Path, tmp_path: Path) -> None:
    """Regression: ``split in 0.3 s`` for a command the user timed at 1.24 s (the clock started after
    onnx and onnxruntime were loaded).  A process that spends a second before ``main`` must say so."""
    code = "import sys, time\ntime.sleep(1.0)\nfrom onnxpipe.cli import main\nsys.exit(main())\n"
    argv = ["split", mlp, "--stages", "2", "--out", tmp_path / "out", "--cost", "static", "-q"]
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    said = re.search(r"^split in (\d+\.\d) s$", done.stdout, re.M)
    assert said is not None and float(said.group(1)) >= 1.0, done.stdout


HEAVY_MODULES = ("numpy", "onnx", "onnxruntime", "matplotlib")
"""What ``--help``, ``--version`` and a usage error must not load: each command's work does."""


@pytest.mark.parametrize(
    "args", [["--version"], ["--help"], ["split", "--help"], ["run", "--help"], ["plan", "m.onnx"]]
)
def test_help_version_and_usage_errors_load_no_heavy_module(args: list[str]) -> None:
    """The parsers import argparse and light modules only; the door's functions, which the work calls, are
    imported when a command runs, so that ``onnxpipe --version`` answers at once."""
    code = (
        "import sys\n"
        "from onnxpipe.cli import main\n"
        "try:\n"
        "    main(sys.argv[1:])\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print('LOADED', sorted(m for m in {HEAVY_MODULES!r} if m in sys.modules), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert done.stderr.strip().splitlines()[-1] == "LOADED []", done.stderr


def test_verify_answers_before_loading_the_model_libraries(done: Path) -> None:
    """Issue 39: ``verify`` said nothing for 8-9 s on a loaded machine, importing onnx and onnxruntime
    before its first line; a command given a model or a folder says so before its work loads them."""
    code = (
        "import io, sys\n"
        "class Terminal(io.StringIO):\n"
        "    def isatty(self):\n"
        "        return True\n"
        "    def write(self, text):\n"
        "        if text.startswith('... reading'):\n"
        f"            loaded = sorted(m for m in {HEAVY_MODULES!r} if m in sys.modules)\n"
        "            print(text.strip(), 'with', loaded, 'loaded', file=sys.__stdout__)\n"
        "        return super().write(text)\n"
        "sys.stderr = Terminal()\n"
        "from onnxpipe.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    done_ = subprocess.run(
        [sys.executable, "-c", code, "verify", str(done)], capture_output=True, text=True, timeout=300
    )
    assert done_.returncode == 0, done_.stdout + done_.stderr
    first = done_.stdout.splitlines()[0]
    assert first.startswith("... reading done (") and first.endswith(") with [] loaded"), done_.stdout


def test_every_parser_has_its_work() -> None:
    from onnxpipe.cli import WORK
    from onnxpipe.cli.parsers import SUBCOMMANDS

    assert [c.name for c in SUBCOMMANDS] == list(WORK)
    for name in WORK:
        assert callable(WORK[name])


@pytest.fixture
def read_only(tmp_path: Path) -> Path:
    """A folder no file can be made in: one without write permission, or for root (whom permissions do
    not stop) /proc, where no file can be created."""
    if os.geteuid() != 0:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    if not Path("/proc/self").is_dir():
        pytest.skip("running as root without /proc: no folder to make read-only")
    return Path("/proc")


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["profile", "{model}", "--out", "{ro}/p.json"], 2, "{ro}/p.json: cannot be written"),
        (["split", "{model}", "-k", "2", "--out", "{ro}/out"], 6, "{ro}/out: cannot be written"),
        (["plan", "{model}", "-k", "2", "--plot", "{ro}/p.png"], 2, "{ro}/p.png: cannot be written"),
        (["run", "{dir}", "--report", "{ro}/r.json"], 2, "{ro}/r.json: cannot be written"),
        (["run", "{dir}", "--outputs", "{ro}/o.npz"], 2, "{ro}/o.npz: cannot be written"),
        (["plan", "{model}", "-k", "2", "--plot", "p.gif"], 2, "p.gif: cannot tell the picture format"),
    ],
    ids=["profile", "split", "plan-plot", "run-report", "run-outputs", "plot-format"],
)
def test_unwritable_paths_are_refused_before_loading(
    args: list[str], code: int, says: str, read_only: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """One line, the documented code, no traceback; the model (and split folder) do not exist: the
    refusal came before loading them."""
    fill = {"model": str(work / "absent.onnx"), "ro": str(read_only), "dir": str(work / "absent")}
    got, out, err = run([a.format(**fill) for a in args], capfd)
    assert got == code, err
    assert out == ""
    assert says.format(**fill) in one_line_error(err, args[0])


def test_busy_machine_is_flagged(
    mlp: Path, work: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import onnxpipe.api.preamble as preamble

    monkeypatch.setattr(preamble, "busy_elsewhere", lambda before, after: 1.5)
    code, out, err = run(["profile", mlp, "--out", "p.json", "--runs", "2", "--warmup", "0"], capfd)
    assert code == 0, err
    assert "warning: other processes kept 1.5 CPU(s) busy during profiling" in out


@pytest.mark.parametrize("stages", [MLP_NODES + 1, 1000])
def test_more_stages_than_nodes_exits_5(
    stages: int, mlp: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["split", mlp, "--stages", stages, "--out", "out", "--cost", "static"], capfd)
    assert code == 5 and out == ""
    line = one_line_error(err, "split")
    assert f"cannot make {stages} non-empty stages from {MLP_NODES} compute nodes" in line
    assert f"between 1 and {MLP_NODES}" in line
    assert list(work.iterdir()) == []


def test_as_many_stages_as_nodes_works(mlp: Path, work: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["split", mlp, "--stages", MLP_NODES, "--out", "out"], capfd)
    assert code == 0 and f"wrote {MLP_NODES} stages" in out


@pytest.mark.parametrize(
    ("shape", "says"),
    [
        ("x", "expected NAME=D1,D2"),
        ("=1,64", "expected NAME=D1,D2"),
        ("x=a,64", "'a' is not a whole number"),
        ("x=1,-64", "dims must be >= 0"),
        ("x=1", "rank 2"),
        ("x=1,65", "fixed at 64"),
        ("nosuch=1,64", "not a model input"),
    ],
)
@pytest.mark.parametrize("command", ["split", "profile", "verify"])
def test_malformed_shape_exits_2(
    shape: str,
    says: str,
    command: str,
    mlp: Path,
    work: Path,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    split_ok(mlp, tmp_path / "done", 2)
    before = snapshot(work)
    args = {
        "split": ["split", mlp, "-k", "2", "--out", "out", "--shape", shape],
        "profile": ["profile", mlp, "--out", "p.json", "--shape", shape],
        "verify": ["verify", tmp_path / "done", "--shape", shape],
    }[command]
    code, _, err = run(args, capfd)
    assert code == 2, err
    line = one_line_error(err, command, says_what_to_do=False)  # see test_shape_errors_say_what_to_do
    assert says in line
    assert snapshot(work) == before
    no_leftovers(work)


def test_shape_errors_say_what_to_do(mlp: Path, work: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Regression: most --shape errors had no '; <what to do>' part, unlike the documented line."""
    lacking = []
    for shape in ["x", "x=1,-64", "x=1", "x=1,65"]:
        _, _, err = run(["profile", mlp, "--out", "p.json", "--cost", "static", "--shape", shape], capfd)
        line = one_line_error(err, "profile", says_what_to_do=False)
        if "; " not in line:
            lacking.append(line)
    assert lacking == []


ARGPARSE_ERRORS = [
    (["profile", "{m}"], "the following arguments are required: --out"),
    (["profile", "{m}", "--out", "p.json", "--runs", "0"], "argument --runs: 0 must be at least 1"),
    (["profile", "{m}", "--out", "p.json", "--cost", "bogus"], "argument --cost: invalid choice: 'bogus'"),
    (["profile", "{m}", "--out", "p.json", "--bogus"], "unknown option --bogus"),
    (["split", "{m}", "--out", "out"], "the following arguments are required: --stages/-k"),
    (["split", "{m}", "--stags", "2"], "unknown option --stags (did you mean --stages?)"),
    (["split", "{m}", "-k", "2", "--ouput", "out"], "unknown option --ouput (did you mean --out?)"),
    (["split", "{m}", "-k", "2", "--out", "out", "--order", "sideways"], "invalid choice: 'sideways'"),
    (["split", "{m}", "-k", "2", "--out", "out", "--verbose"], "unknown option --verbose"),
    (["plan", "{m}", "--plot", "p.png"], "the following arguments are required: --stages/-k"),
    (["plan", "{m}", "-k", "2", "--plot", "p.png", "--microbatches", "0"], "argument --microbatches: 0"),
    (["plan", "{m}", "-k", "2", "--plot", "p.png", "extra"], "unrecognized arguments: extra"),
    (["verify"], "the following arguments are required: dir"),
    (["verify", "{d}", "--rtol", "tight"], "argument --rtol: 'tight' is not a number"),
    (["run", "--report", "r.json"], "the following arguments are required: dir"),
    (["run", "{d}", "--backend", "mpi", "--report", "r.json", "--outputs", "o.npz"], "choice: 'mpi'"),
    (["run", "{d}", "--warmup", "-1", "--report", "r.json"], "argument --warmup: -1 must be 0 or more"),
    (["run", "{d}", "--report", "r.json", "--no-such"], "unknown option --no-such"),
    (["inspect"], "the following arguments are required: target"),
    (["inspect", "{d}", "more"], "unrecognized arguments: more"),
    ([], "the following arguments are required: COMMAND"),
    (["splt", "{m}", "-k", "2", "--out", "out"], "argument COMMAND: invalid choice: 'splt'"),
    (["--bogus", "inspect", "{d}"], "unknown option --bogus"),
]


@pytest.mark.parametrize(
    ("args", "says"), ARGPARSE_ERRORS, ids=[" ".join(a) or "-" for a, _ in ARGPARSE_ERRORS]
)
def test_argparse_errors_are_one_line(
    args: list[str], says: str, mlp: Path, done: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Regression: argparse printed its whole usage block before the error; now the error is the one line,
    exit 2 (a usage error), ending in where to read the usage; nothing is written (``--out``, ``--plot``,
    ``--report``, ``--outputs`` all name files in ``work``)."""
    command = args[0] if args and args[0] in {"profile", "split", "plan", "verify", "run", "inspect"} else ""
    before, split_before = snapshot(work), snapshot(done)
    code, out, err = run([a.format(m=mlp, d=done) for a in args], capfd)
    assert code == 2 and out == ""
    line = one_line_error(err, command)
    prog = f"onnxpipe {command}" if command else "onnxpipe"
    assert line.endswith(f"; see '{prog} --help'"), line
    assert says in line
    assert snapshot(work) == before and snapshot(done) == split_before
    no_leftovers(work)


def test_non_empty_output_folder_exits_6_and_is_left_intact(
    mlp: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    old = work / "out"
    old.mkdir()
    (old / "notes.txt").write_text("keep me")
    (old / "stage_0.onnx").write_bytes(b"not a stage")
    (old / ".hidden").write_text("hidden")
    before = snapshot(work)
    code, out, err = run(["split", mlp, "-k", "2", "--out", "out"], capfd)
    assert code == 6 and out == ""
    line = one_line_error(err, "split")
    assert "out: exists, is not empty" in line and "--force" in line and "pass --force" not in line
    assert snapshot(work) == before
    no_leftovers(work)


def test_force_replaces_only_a_complete_folder(
    mlp: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    old = work / "out"
    code, _, err = run(["split", mlp, "-k", "3", "--out", "out", "--cost", "static"], capfd)
    assert code == 0, err
    before = snapshot(work)
    # a failing --force run (K out of range) keeps the old folder
    code, _, _ = run(["split", mlp, "-k", "99", "--out", "out", "--force", "--cost", "static"], capfd)
    assert code == 5 and snapshot(work) == before
    code, _, err = run(["split", mlp, "-k", "2", "--out", "out", "--force", "--cost", "static"], capfd)
    assert code == 0, err
    assert sorted(p.name for p in old.iterdir()) == ["manifest.json", "stage_0.onnx", "stage_1.onnx"]
    assert sorted(p.name for p in work.iterdir()) == ["out"]
    no_leftovers(work)


def test_empty_output_folder_is_used(mlp: Path, work: Path, capfd: pytest.CaptureFixture[str]) -> None:
    (work / "out").mkdir()
    code, _, err = run(["split", mlp, "-k", "2", "--out", "out", "--cost", "static"], capfd)
    assert code == 0, err
    assert (work / "out" / "manifest.json").is_file()


def test_output_that_is_a_file_exits_6(mlp: Path, work: Path, capfd: pytest.CaptureFixture[str]) -> None:
    (work / "out").write_text("a file")
    code, _, err = run(["split", mlp, "-k", "2", "--out", "out", "--cost", "static", "--force"], capfd)
    assert code == 6
    assert "is not a folder" in one_line_error(err, "split")
    assert (work / "out").read_text() == "a file"
    no_leftovers(work)


def test_missing_parents_are_created(mlp: Path, work: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["split", mlp, "-k", "2", "--out", "a/b/c", "--cost", "static"], capfd)
    assert code == 0, err
    assert (work / "a" / "b" / "c" / "manifest.json").is_file()


def test_split_into_the_current_empty_folder(
    mlp: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Regression: the cwd used to be renamed away, then verify read 'manifest.json' from the deleted cwd."""
    code, _, err = run(["split", mlp, "-k", "2", "--out", ".", "--cost", "static"], capfd)
    assert (work / "manifest.json").is_file()
    assert code == 0, err
    assert sorted(p.name for p in work.iterdir()) == ["manifest.json", "stage_0.onnx", "stage_1.onnx"]


def test_profile_output_that_exists_exits_2(mlp: Path, work: Path, capfd: pytest.CaptureFixture[str]) -> None:
    (work / "p.json").write_text("old")
    code, out, err = run(["profile", mlp, "--out", "p.json", "--cost", "static"], capfd)
    assert code == 2 and out == ""
    assert "p.json: exists" in one_line_error(err, "profile")
    assert (work / "p.json").read_text() == "old"
    code, _, _ = run(["profile", mlp, "--out", "p.json", "--cost", "static", "--force"], capfd)
    assert code == 0 and onnxpipe.Profile.load(work / "p.json").source == "static"


def test_profile_of_another_model_exits_4(
    mlp: Path, sample_models_dir: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    assert run(["profile", mlp, "--out", "mlp.json", "--cost", "static"], capfd)[0] == 0
    before = snapshot(work)
    other = sample_models_dir / "resnet_tiny.onnx"
    code, out, err = run(["split", other, "-k", "2", "--out", "out", "--profile", "mlp.json"], capfd)
    assert code == 4 and out == ""
    line = one_line_error(err, "split")
    assert "mlp.json: made for model mlp.onnx" in line and "resnet_tiny.onnx" in line
    assert snapshot(work) == before


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "expected a JSON object"),
        ('{"schema_version": 99}', "schema_version 99"),
        (None, "cannot read the profile"),
    ],
)
def test_unreadable_profile_exits_4(
    content: str | None, says: str, mlp: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    if content is not None:
        (work / "p.json").write_text(content)
    code, out, err = run(["split", mlp, "-k", "2", "--out", "out", "--profile", "p.json"], capfd)
    assert code == 4 and out == ""
    line = one_line_error(err, "split")
    assert "p.json" in line and says in line
    assert not (work / "out").exists()


@pytest.fixture
def done(mlp: Path, tmp_path: Path) -> Path:
    out = tmp_path / "done"
    split_ok(mlp, out, 3)
    return out


def test_stage_changed_after_export_exits_7(done: Path, capfd: pytest.CaptureFixture[str]) -> None:
    with (done / "stage_1.onnx").open("ab") as f:
        f.write(b"\0")
    code, out, err = run(["verify", done], capfd)
    assert code == 7 and out == ""
    line = one_line_error(err, "verify")
    assert "stage 1 file stage_1.onnx changed after export (sha256 mismatch)" in line
    # inspect still lists the stages, names the damage, exits 1; without the file check, 0
    code, out, _ = run(["inspect", done], capfd)
    assert code == 1 and "error: stage 1 file stage_1.onnx changed after export (sha256 mismatch)" in out
    assert "stage  device" in out
    # issue 39: the damage first, and no "verification: passed" that the changed file no longer backs
    assert out.index("error: stage 1") < out.index("stage  device") < out.index("verification:")
    assert "verification: passed (" not in out
    assert "verification: passed for the files the split wrote, which have changed since" in out
    code, out, _ = run(["inspect", done, "--no-file-check"], capfd)
    assert code == 0 and "error:" not in out and "sha256 checked" not in out
    code, out, _ = run(["inspect", done, "--json"], capfd)
    problems = json.loads(out)["file_problems"]
    assert code == 1 and problems == ["stage 1 file stage_1.onnx changed after export (sha256 mismatch)"]


def test_missing_stage_file_exits_7(done: Path, capfd: pytest.CaptureFixture[str]) -> None:
    (done / "stage_2.onnx").unlink()
    code, _, err = run(["verify", done], capfd)
    assert code == 7 and "stage 2 file stage_2.onnx is missing" in one_line_error(err, "verify")


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda m: "{truncated", "not valid JSON"),
        (lambda m: json.dumps({**m, "schema_version": SCHEMA_VERSION + 1}), "schema_version"),
        (lambda m: json.dumps({k: v for k, v in m.items() if k != "stages"}), "stages"),
        (
            lambda m: json.dumps(
                {**m, "stages": [{**m["stages"][0], "file": "../x.onnx"}, *m["stages"][1:]]}
            ),
            "file",
        ),
    ],
    ids=["not-json", "schema", "no-stages", "file-outside"],
)
@pytest.mark.parametrize("command", ["verify", "inspect"])
def test_malformed_manifest_exits_7(
    edit: object, says: str, command: str, done: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    manifest = json.loads((done / "manifest.json").read_text())
    (done / "manifest.json").write_text(edit(manifest))  # type: ignore[operator]
    code, out, err = run([command, done], capfd)
    assert code == 7 and out == ""
    line = one_line_error(err, command)
    assert "manifest.json" in line and says in line


def test_verify_with_another_model_exits_7(
    done: Path, sample_models_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["verify", done, "--model", sample_models_dir / "resnet_tiny.onnx"], capfd)
    assert code == 7 and "is not the source sha256" in one_line_error(err, "verify")


def test_verify_with_a_missing_model_exits_2(
    done: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["verify", done, "--model", tmp_path / "gone.onnx"], capfd)
    assert code == 2 and "gone.onnx: no such model file" in one_line_error(err, "verify")


def test_wrong_results_exit_1(done: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A stage that computes something else (its hash re-recorded) is a mismatch, not an error."""
    path = done / "stage_0.onnx"
    model = onnx.load(str(path))
    weight = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    values = numpy_helper.to_array(weight).copy()
    values += 1.0
    weight.CopyFrom(numpy_helper.from_array(values, weight.name))
    onnx.save_model(model, str(path))
    rehash(done, 0)
    code, out, err = run(["verify", done], capfd)
    assert code == 1 and err == ""
    assert "y: MISMATCH" in out and "DO NOT match" in out


def test_stage_failing_at_run_time_exits_8(done: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A stage whose declared input shape no longer fits what the previous stage sends."""
    path = done / "stage_1.onnx"
    model = onnx.load(str(path))
    dim = model.graph.input[0].type.tensor_type.shape.dim[-1]
    dim.ClearField("dim_param")
    dim.dim_value = 999
    onnx.save_model(model, str(path))
    rehash(done, 1)
    code, out, err = run(["verify", done], capfd)
    assert code == 8 and preamble_only(out)  # the steps it began, no result
    line = one_line_error(err, "verify")
    assert "stage_1.onnx: stage 1 " in line


@pytest.mark.parametrize("old", [False, True])
def test_interrupt_exits_130_and_leaves_nothing_half_written(
    old: bool, mlp: Path, work: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if old:  # a previous split, which --force may replace
        code, _, err = run(["split", mlp, "-k", "2", "--out", "out", "--cost", "static"], capfd)
        assert code == 0, err
    before = snapshot(work)
    real_save = onnx.save_model
    calls = []

    def save_then_interrupt(*args: object, **kwargs: object) -> None:
        calls.append(args)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real_save(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(onnx, "save_model", save_then_interrupt)
    args = ["split", mlp, "-k", "3", "--out", "out", "--cost", "static"] + (["--force"] if old else [])
    code, _, err = run(args, capfd)
    assert code == 130 and len(calls) == 2
    left = "the earlier split in out is unchanged" if old else "nothing was written to out"
    assert err.strip() == f"onnxpipe split: interrupted while the stages were written: {left}"
    assert snapshot(work) == before
    no_leftovers(work)
    assert sorted(p.name for p in work.iterdir()) == (["out"] if old else [])


def test_repeated_runs_write_identical_stages(
    mlp: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Two CLI runs in one process are independent (no global state) and deterministic: same stage bytes."""
    for name in ("a", "b"):
        assert run(["split", mlp, "-k", "3", "--out", name, "--cost", "static"], capfd)[0] == 0
    a, b = snapshot(work / "a"), snapshot(work / "b")
    assert a.keys() == b.keys()
    for key in a:
        if key.endswith(".onnx"):
            assert a[key] == b[key], key


def custom_op_model() -> onnx.ModelProto:
    """Valid for the checker (unknown domains are not checked) but onnxruntime has no such op."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="relu"),
        helper.make_node("Foo", ["h"], ["y"], name="foo", domain="com.example"),
    ]
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=opsets)


def test_model_onnxruntime_cannot_run(work: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Profiling fails with 4; a static split fails at the stage check with 6; nothing is left behind."""
    onnx.save_model(custom_op_model(), str(work / "custom.onnx"))
    code, out, err = run(["profile", "custom.onnx", "--out", "p.json"], capfd)
    assert code == 4 and preamble_only(out) and "is not a registered function/op" in err
    code, out, err = run(["split", "custom.onnx", "-k", "2", "--out", "out", "--cost", "static"], capfd)
    assert code == 6 and preamble_only(out)
    line = one_line_error(err, "split")
    assert "stage 1 does not load in onnxruntime at node 'foo'" in line
    assert sorted(p.name for p in work.iterdir()) == ["custom.onnx"]
    no_leftovers(work)


def test_profile_error_from_onnxruntime_is_one_line(work: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Regression: onnxruntime's own logger added an '[E:onnxruntime ...] EndProfiling' line to stderr."""
    onnx.save_model(custom_op_model(), str(work / "custom.onnx"))
    code, _, err = run(["profile", "custom.onnx", "--out", "p.json"], capfd)
    assert code == 4
    one_line_error(err, "profile")


needs_rlimit = pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="needs POSIX file size limits")


@needs_rlimit
def test_split_that_cannot_write_leaves_nothing(mlp: Path, work: Path) -> None:
    proc = run_with_file_size_limit(
        50_000, ["split", str(mlp), "-k", "2", "--out", "out", "--cost", "static"], work
    )
    assert proc.returncode == 6, proc.stderr
    assert "cannot be written (File too large)" in one_line_error(proc.stderr, "split")
    assert list(work.iterdir()) == []


@needs_rlimit
def test_profile_that_cannot_write_leaves_nothing(mlp: Path, work: Path) -> None:
    """Regression: Profile.save wrote in place, so a failed write left a truncated profile behind."""
    proc = run_with_file_size_limit(1000, ["profile", str(mlp), "--out", "p.json", "--cost", "static"], work)
    assert proc.returncode == 4, proc.stderr
    assert "cannot write the profile" in one_line_error(proc.stderr, "profile")
    assert list(work.iterdir()) == []


def test_split_for_a_cluster_records_the_devices(
    resnet: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(
        [
            "split",
            resnet,
            "-k",
            "2",
            "--out",
            "out",
            "--cost",
            "static",
            "--devices",
            DEVICES / "two_cpus.json",
        ],
        capfd,
    )
    assert code == 0, err
    manifest = onnxpipe.load_manifest(work / "out")
    assert [s.device for s in manifest.stages] == ["cpu0", "cpu1"]


def test_json_output_parses_back(mlp: Path, work: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """``--json`` prints one document on stdout with the manifest's field names; the preamble goes to
    stderr; split's manifest part reads back as a manifest."""
    code, out, err = run(["split", mlp, "-k", "2", "-o", "s", "--cost", "static", "--json"], capfd)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["command"] == "split" and doc["json_schema_version"] == 1
    manifest = onnxpipe.Manifest.from_json(json.dumps(doc["manifest"]))
    assert manifest == onnxpipe.load_manifest(work / "s")
    assert doc["verification"]["ok"] is True and doc["verification"]["outputs"][0]["name"] == "y"
    assert "input x:" in err and "split in" in err

    code, out, err = run(["plan", mlp, "-k", "2", "--cost", "static", "--json"], capfd)
    assert code == 0, err
    plan = json.loads(out)["plan"]
    # the same names, and the same numbers, as the manifest of the same plan
    for key in ("k", "bottleneck_seconds", "lower_bound_seconds", "cost_source", "threads"):
        assert plan[key] == doc["manifest"]["plan"][key], key
    for got, written in zip(plan["stages"], doc["manifest"]["stages"], strict=True):
        for key in (
            "index",
            "device",
            "node_count",
            "estimated_compute_seconds",
            "param_bytes",
            "link_bytes_in",
        ):
            assert got[key] == written[key], key
    assert plan["schedule"]["kind"] == doc["manifest"]["schedule"]["kind"]

    code, out, err = run(["verify", "s", "--json"], capfd)
    assert code == 0, err
    verification = json.loads(out)["verification"]
    assert verification["ok"] is True and verification["rtol"] == 1e-4 and verification["seed"] == 0

    code, out, _ = run(["inspect", "s", "--json"], capfd)
    assert code == 0 and json.loads(out)["manifest"] == doc["manifest"]

    code, out, _ = run(["inspect", mlp, "--json"], capfd)
    model = json.loads(out)["model"]
    assert code == 0 and model["model_inputs"] == [{"name": "x", "dtype": "float32", "shape": ["batch", 64]}]
    assert model["node_count"] == MLP_NODES and model["control_flow"] == [] and model["external_data"] == []
    assert model["opsets"]["ai.onnx"] > 0 and model["param_bytes"] > 0


def test_inspect_model_shows_inputs_opsets_and_control_flow(
    work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    branch_out = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n", 4])
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["b"])], "then", [], [branch_out])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["b"])], "else", [], [branch_out])
    node = helper.make_node("If", ["c"], ["y"], name="choose", then_branch=then, else_branch=other)
    model = helper.make_model(
        helper.make_graph([node], "g", [x, cond], [y]), opset_imports=[helper.make_opsetid("", 17)]
    )
    onnx.save_model(model, str(work / "if.onnx"))
    code, out, err = run(["inspect", "if.onnx"], capfd)
    assert code == 0, err
    assert (
        "input x: float32 [n, 4]" in out and "input c: bool []" in out and "output y: float32 [n, 4]" in out
    )
    assert "opsets: ai.onnx 17" in out
    assert "control flow: 1 node(s) with subgraphs" in out and "choose (If)" in out
    assert "external data: none" in out


def test_manifest_link_model_is_optional_and_checked(
    mlp: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["split", mlp, "-k", "2", "-o", "s", "--cost", "static", "--no-verify"], capfd)
    assert code == 0, err
    assert "links: serial (a stage's transfer in adds to its compute)" in out
    obj = json.loads((work / "s" / "manifest.json").read_text())
    assert obj["plan"]["link_model"] == "serial"
    del obj["plan"]["link_model"]
    assert onnxpipe.Manifest.from_json(sealed(obj)).plan.link_model is None  # an older manifest reads
    obj["plan"]["link_model"] = "telepathy"
    with pytest.raises(onnxpipe.ManifestError, match="link_model"):
        onnxpipe.Manifest.from_json(sealed(obj))


def test_interrupted_verification_leaves_the_earlier_split_and_verify_completes_an_unverified_one(
    mlp: Path, work: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 39: Ctrl-C while a ``--force`` split is verified leaves the earlier split as it was (the new
    one is verified before it replaces it), and says so."""
    import onnxpipe.api.splitting

    code, _, err = run(["split", mlp, "-k", "2", "-o", "s", "--cost", "static", "--no-verify"], capfd)
    assert code == 0, err
    before = snapshot(work)
    checked: list[Path] = []

    def interrupted(folder: Path, *args: object, **kwargs: object) -> None:
        checked.append(folder)
        assert (folder / "stage_2.onnx").is_file() and not (work / "s" / "stage_2.onnx").exists()
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(onnxpipe.api.splitting, "verify_folder", interrupted)
        code, _, err = run(["split", mlp, "-k", "3", "-o", "s", "--cost", "static", "--force"], capfd)
    assert code == 130, err
    assert err.strip() == (
        "onnxpipe split: interrupted during verification: the earlier split in s is unchanged"
    )
    assert snapshot(work) == before
    no_leftovers(work)
    (folder,) = checked  # the new split, verified where it was written: beside s, not in it
    assert folder.parent.resolve() == work.resolve() and folder.name.startswith(".s.onnxpipe-tmp-")
    manifest = onnxpipe.load_manifest(work / "s")
    assert manifest.verification is not None and manifest.verification.status == "unverified"
    code, out, _ = run(["inspect", "s"], capfd)
    assert "verification: unverified: the stages were not compared" in out

    code, out, err = run(["verify", "s"], capfd)  # no --force: verify completes the folder
    assert code == 0, err
    assert "recorded in s/manifest.json: verification passed" in out
    record = onnxpipe.load_manifest(work / "s").verification
    assert record is not None and record.status == "passed" and record.rtol == 1e-4 and record.runs >= 1

    # a folder that cannot take the result still verifies, and says it could not record it
    import onnxpipe.verification.verify as rec

    def cannot(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(rec, "write_manifest", cannot)
    code, out, err = run(["verify", "s"], capfd)
    assert code == 0 and err == "" and "the result could not be written into its manifest" in out


def test_a_verification_that_fails_to_run_leaves_the_earlier_split_and_names_the_folder(
    mlp: Path, work: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import onnxpipe.api.splitting

    code, _, err = run(["split", mlp, "-k", "2", "-o", "s", "--cost", "static"], capfd)
    assert code == 0, err
    before = snapshot(work)

    def stage_fails(folder: Path, *args: object, **kwargs: object) -> None:
        raise onnxpipe.RuntimeStageError(f"{folder / 'stage_1.onnx'}: stage 1 failed (boom); re-run split")

    monkeypatch.setattr(onnxpipe.api.splitting, "verify_folder", stage_fails)
    code, _, err = run(["split", mlp, "-k", "3", "-o", "s", "--cost", "static", "--force"], capfd)
    assert code == 8 and "onnxpipe-tmp" not in err
    assert one_line_error(err, "split").endswith("s/stage_1.onnx: stage 1 failed (boom); re-run split")
    assert snapshot(work) == before
    no_leftovers(work)


def test_split_records_its_verification(mlp: Path, work: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["split", mlp, "-k", "2", "-o", "s", "--cost", "static"], capfd)
    assert code == 0, err
    record = onnxpipe.load_manifest(work / "s").verification
    assert (
        record is not None and record.status == "passed" and dict(record.input_shapes or {}) == {"x": (1, 64)}
    )
    code, _, err = run(["split", mlp, "-k", "2", "-o", "n", "--cost", "static", "--no-verify"], capfd)
    assert code == 0, err
    record = onnxpipe.load_manifest(work / "n").verification
    assert record is not None and record.status == "unverified"


def test_run_warns_when_the_stages_threads_exceed_the_cpus(
    mlp: Path, work: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import onnxpipe.api.preamble as preamble

    code, _, err = run(["split", mlp, "-k", "4", "-o", "s", "--cost", "static", "--no-verify", "-q"], capfd)
    assert code == 0, err
    monkeypatch.setattr(preamble, "available_cpu_count", lambda: 2)
    code, out, err = run(["run", "s", "--microbatches", "4", "--warmup", "0"], capfd)
    assert code == 0, err
    assert "warning: 4 stages x 1 thread(s) = 4 threads on 2 CPU(s)" in out and "split again" in out
    assert "... running 4 micro-batch(es)" in out and out.splitlines()[-1].startswith("ran in ")


def test_run_json_is_one_document_on_stdout(mlp: Path, work: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """``run --json``, as every other command's: one JSON document on stdout, what it says on stderr."""
    code, _, err = run(["split", mlp, "-k", "2", "-o", "s", "--cost", "static", "--no-verify", "-q"], capfd)
    assert code == 0, err
    code, out, err = run(["run", "s", "--microbatches", "4", "--warmup", "0", "--json"], capfd)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["command"] == "run" and doc["json_schema_version"] == 1
    assert doc["report"]["k"] == 2 and len(doc["report"]["stages"]) == 2
    assert "ran in " in err.splitlines()[-1]


def table_headers(text: str) -> list[list[str]]:
    """The headers of every table in ``text``, one per column: a table is a header line over a line of
    dash runs (:func:`onnxpipe.core.text.table`), each run spanning its column."""
    lines = text.splitlines()
    found = []
    for head, rule in itertools.pairwise(lines):
        if rule.strip() and set(rule) <= {"-", " "}:
            found.append([head[m.start() : m.end()].strip() for m in re.finditer(r"-+", rule)])
    return found


def test_every_column_has_a_header_and_the_byte_columns_are_explained(
    resnet: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Regression: ``--stages auto``'s table had a last column without a header, and ``bytes in`` and
    ``link in`` differed with nothing saying why.  Every table plan, split and inspect print names each
    column, and a stage table's byte columns are explained under it."""
    outputs = []
    for args in (
        ["plan", resnet, "--stages", "auto", "--cost", "static"],
        ["split", resnet, "--stages", "auto", "--cost", "static", "--out", work / "s"],
        ["inspect", work / "s"],
    ):
        code, out, err = run(args, capfd)
        assert code == 0, err
        outputs.append(out)
        headers = table_headers(out)
        assert headers and all(all(headers) for headers in headers), headers
        assert all(("link in" in h) == ("bytes in" in h) for h in headers)
        stage_tables = [i for i, line in enumerate(out.splitlines()) if "link in" in line]
        assert stage_tables, out
        lines = out.splitlines()
        after = lines[stage_tables[0] + 2 :]
        legend = next(line for line in after if not line.startswith(tuple("0123456789")))
        assert legend.startswith("bytes in: what a stage reads") and "link in: what crosses" in legend
    assert any(["stages", "bottleneck ms", "per second", "choice"] in table_headers(o) for o in outputs)
