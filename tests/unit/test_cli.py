"""The ``onnxpipe`` command: every subcommand, documented exit codes, one-line errors, nothing half-written.

Everything runs through :func:`onnxpipe.cli.main` in-process, and once through the installed console script
in a subprocess.  The exit codes asserted here are the table in ``docs/cli.md`` (the table itself is
checked against the error classes), and every refused request must leave the file system as it was: no
output folder, no temporary folder, the old contents of an existing folder intact.
"""

from __future__ import annotations

import argparse
import re
import shutil
import time
from pathlib import Path

import onnx
import pytest
from cli_runner import no_leftovers, one_line_error, run, snapshot
from onnx import TensorProto, helper
from paths import DEVICES, REPO_ROOT

import onnxpipe
from onnxpipe.cli import build_parser
from onnxpipe.cli.say import COMMAND_START, Say, process_start
from onnxpipe.core import errors

DOCS = REPO_ROOT / "docs" / "cli.md"
IMPORTED = time.perf_counter()


def fails_checker_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    node = helper.make_node("NoSuchOperator", ["x"], ["y"], name="bad")
    return helper.make_model(
        helper.make_graph([node], "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)]
    )


def documented_exit_codes() -> dict[str, int]:
    """``error class -> code`` from the table in docs/cli.md."""
    codes: dict[str, int] = {}
    for line in DOCS.read_text().splitlines():
        m = re.match(r"^\|\s*(\d+)\s*\|[^|]*\|\s*`(\w+)`\s*\|", line)
        if m:
            codes[m.group(2)] = int(m.group(1))
    return codes


def test_exit_code_table_matches_the_error_classes() -> None:
    codes = documented_exit_codes()
    assert len(codes) == 8
    for name, code in codes.items():
        cls = getattr(errors, name)
        assert issubclass(cls, onnxpipe.OnnxpipeError)
        assert cls.exit_code == code, f"{name}: docs say {code}, the class says {cls.exit_code}"


def test_every_documented_option_is_accepted() -> None:
    text = DOCS.read_text()
    block = text.split("```")[1]
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    choices: dict[str, argparse.ArgumentParser] = sub.choices
    command = ""
    seen: set[str] = set()
    for line in block.splitlines():
        m = re.match(r"^onnxpipe ([\w-]+)", line)
        if m:
            command = m.group(1)
            seen.add(command)
        for option in re.findall(r"(--[a-z][a-z-]*)", line):
            assert option in choices[command]._option_string_actions, f"{command} {option}"
    assert seen == set(choices) and {"profile", "split", "verify", "inspect"} <= seen


def _bad_model(kind: str, folder: Path, good: Path) -> Path:
    path = folder / f"{kind}.onnx"
    data = good.read_bytes()
    if kind == "missing":
        pass
    elif kind == "folder":
        path.mkdir()
    elif kind == "text":
        path.write_text("this is not an ONNX model\n")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated_half":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "truncated_end":
        path.write_bytes(data[:-3])
    elif kind == "fails_checker":
        onnx.save_model(fails_checker_model(), str(path))
    else:
        raise AssertionError(kind)
    return path


BAD_MODELS = ["missing", "folder", "text", "empty", "truncated_half", "truncated_end", "fails_checker"]


@pytest.mark.parametrize("kind", BAD_MODELS)
@pytest.mark.parametrize("command", ["split", "profile", "inspect"])
def test_unloadable_model_exits_3(
    kind: str, command: str, mlp: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    bad = _bad_model(kind, work, mlp)
    before = snapshot(work)
    args = {
        "split": ["split", bad, "--stages", "2", "--out", "out"],
        "profile": ["profile", bad, "--out", "p.json"],
        "inspect": ["inspect", bad],
    }[command]
    code, out, err = run(args, capfd)
    # inspect takes a folder for a split folder: no manifest there is a manifest error
    assert code == (7 if (command, kind) == ("inspect", "folder") else 3), err
    line = one_line_error(err, command)
    assert f"{bad.name}" in line and out == ""
    if kind == "fails_checker":
        assert "checker" in line and "NoSuchOperator" in line
    assert snapshot(work) == before and not (work / "out").exists() and not (work / "p.json").exists()
    no_leftovers(work)


def _truncate_external_data(model: Path, folder: Path) -> Path:
    """A copy of an external-data model whose ``.data`` file lost its second half."""
    folder.mkdir()
    copy = folder / model.name
    shutil.copy(model, copy)
    data = model.with_name(model.name + ".data").read_bytes()
    copy.with_name(copy.name + ".data").write_bytes(data[: len(data) // 2])
    return copy


@pytest.mark.corpus
@pytest.mark.parametrize("command", ["split", "profile"])
def test_truncated_external_data_exits_3(
    command: str, gpt2_tiny_dynamo_path: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Regression: a truncated .data file was not seen at load (split exited 6, profile 4 with ORT's log)."""
    model = _truncate_external_data(gpt2_tiny_dynamo_path, work / "m")
    args = {
        "split": ["split", model, "--stages", "2", "--out", "out", "--cost", "static"],
        "profile": ["profile", model, "--out", "p.json"],
    }[command]
    code, _, err = run(args, capfd)
    assert not (work / "out").exists() and not (work / "p.json").exists()
    assert code == 3, err


@pytest.mark.parametrize("stages", ["0", "-1", "two", "1.5"])
def test_stages_not_a_positive_integer_is_a_usage_error(
    stages: str, mlp: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["split", mlp, "--stages", stages, "--out", "out"], capfd)
    assert code == 2 and out == ""
    assert one_line_error(err, "split").startswith("onnxpipe split: error: argument --stages/-k: ")
    assert list(work.iterdir()) == []


def test_duplicate_shape_exits_2(mlp: Path, work: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(
        ["split", mlp, "-k", "2", "--out", "o", "--shape", "x=1,64", "--shape", "x=2,64"], capfd
    )
    assert code == 2 and "given twice" in one_line_error(err, "split", says_what_to_do=False)


@pytest.mark.parametrize(
    "args",
    [
        ["--cost", "bogus"],
        ["--external-data", "sometimes"],
        ["--bandwidth", "0"],
        ["--bandwidth", "fast"],
        ["--threads", "0"],
        ["--runs", "0"],
    ],
    ids=lambda a: " ".join(a),
)
def test_bad_option_values_exit_2(
    args: list[str], mlp: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["split", mlp, "-k", "2", "--out", "out", *args], capfd)
    assert code == 2 and out == ""
    assert one_line_error(err, "split").startswith("onnxpipe split: error: argument ")
    assert list(work.iterdir()) == []


@pytest.mark.parametrize("command", ["", "profile", "split", "plan", "run", "verify", "inspect"])
def test_help_still_prints_the_full_usage(command: str, capfd: pytest.CaptureFixture[str]) -> None:
    code, out, err = run([command, "--help"] if command else ["--help"], capfd)
    prog = f"onnxpipe {command}" if command else "onnxpipe"
    assert code == 0 and err == ""
    assert out.startswith(f"usage: {prog} ") and "options:" in out and len(out.splitlines()) > 5


@pytest.mark.parametrize("command", ["verify", "inspect"])
def test_folder_without_manifest_exits_7(command: str, work: Path, capfd: pytest.CaptureFixture[str]) -> None:
    (work / "empty").mkdir()
    code, _, err = run([command, "empty"], capfd)
    assert code == 7 and "manifest.json: no such file" in one_line_error(err, command)


def test_verify_of_a_missing_folder_exits_7(work: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["verify", "nowhere"], capfd)
    assert code == 7 and "nowhere: no such folder" in one_line_error(err, "verify")


def test_no_command_is_a_usage_error(capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = run([], capfd)
    assert code == 2 and "required: COMMAND; see 'onnxpipe --help'" in one_line_error(err, "")


def test_plan_prints_and_writes_nothing(resnet: Path, work: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["plan", resnet, "--stages", "3", "--cost", "static"], capfd)
    assert code == 0 and err == ""
    assert "bottleneck" in out and "lower bound" in out and "schedule stream" in out
    assert list(work.iterdir()) == []


def test_plan_for_a_cluster(resnet: Path, work: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        ["plan", resnet, "--stages", "auto", "--devices", DEVICES / "edge_1248.json", "--order", "free",
         "--cost", "static"],
        capfd,
    )  # fmt: skip
    assert code == 0, err
    assert "--stages auto chose" in out and "--order free tried" in out
    code, out, err = run(
        ["plan", resnet, "-k", "3", "--schedule", "gpipe", "--microbatches", "4", "--cost", "static"], capfd
    )
    assert code == 0, err
    assert "schedule gpipe: 4 micro-batches" in out


def test_plan_draws(resnet: Path, work: Path, capfd: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib", reason="drawing needs the plot extra")
    code, out, err = run(["plan", resnet, "-k", "2", "--cost", "static", "--plot", "plan.svg"], capfd)
    assert code == 0, err
    assert (work / "plan.svg").stat().st_size > 0 and "drew plan.svg" in out


def _devices_file(folder: Path, text: str) -> Path:
    path = folder / "devices.json"
    path.write_text(text)
    return path


ONE_DEVICE = '{"devices": [{"name": "a", "provider": "CPUExecutionProvider", "threads": 1, %s}], "links": []}'


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["--stages", "auto", "--schedule", "1f1b"], 2, "--stages auto without --devices plans streaming"),
        (["-k", "2", "--devices", "missing.json"], 2, "missing.json: no such devices file"),
        (["-k", "2", "--devices", "{bad"], 2, "not valid JSON"),
        (["-k", "1", "--devices", ONE_DEVICE % '"memory": 5'], 2, "did you mean 'memory_bytes'"),
        (["-k", "3", "--devices", str(DEVICES / "two_cpus.json")], 5, "choose --stages between 1 and 2"),
        (["-k", "1", "--devices", ONE_DEVICE % '"memory_bytes": 10'], 5, "smallest memory that fits"),
        (["-k", "3", "--schedule", "1f1b", "--microbatches", "4", "--batch", "2"], 2, "divisor of the batch"),
        (["-k", "3", "--plot", "plan.txt"], 2, "give a file name ending in .png or .svg"),
    ],
    ids=["auto-no-devices", "no-file", "not-json", "unknown-key", "k-over-devices", "no-memory", "batch",
         "plot-format"],
)  # fmt: skip
def test_plan_refusals(
    args: list[str], code: int, says: str, resnet: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    if "--devices" in args:
        i = args.index("--devices") + 1
        if args[i].startswith("{"):
            args = [*args[:i], str(_devices_file(work, args[i])), *args[i + 1 :]]
    before = snapshot(work)
    got, _, err = run(["plan", resnet, "--cost", "static", *args], capfd)
    assert got == code, err
    line = one_line_error(err, "plan", says_what_to_do=False)
    assert says in line
    assert snapshot(work) == before


@pytest.mark.parametrize("ratio", ["-1", "nan", "inf"])
def test_bad_backward_ratio_is_a_usage_error(
    ratio: str, resnet: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(
        ["plan", resnet, "-k", "3", "--schedule", "gpipe", "--backward-ratio", ratio, "--cost", "static"],
        capfd,
    )
    assert code == 2, err
    assert "backward" in one_line_error(err, "plan", says_what_to_do=False)


@pytest.mark.parametrize("command", ["plan", "split"])
def test_nan_bandwidth_is_a_usage_error(
    command: str, resnet: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    extra = ["--out", "out"] if command == "split" else []
    code, _, err = run([command, resnet, "-k", "2", "--bandwidth", "nan", "--cost", "static", *extra], capfd)
    assert code == 2, err
    assert one_line_error(err, command).startswith(f"onnxpipe {command}: error: argument --bandwidth")
    assert list(work.iterdir()) == []


@pytest.mark.parametrize("command", ["profile", "split", "plan", "verify", "run", "inspect"])
def test_help_gives_every_default(command: str) -> None:
    """Every option whose value has a default says it in --help (argparse's own formatter would also
    write "default: None")."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    text = " ".join(sub.format_help().split())
    assert "default: None" not in text and "default: False" not in text
    for action in sub._actions:
        if action.option_strings and action.default not in (None, False, [], argparse.SUPPRESS):
            assert action.help and (
                "default" in action.help or "%(default)s" in sub._get_formatter()._get_help_string(action)
            ), action.option_strings  # type: ignore[attr-defined]
    if command == "verify":
        assert (
            "relative tolerance" in text
            and "absolute tolerance" in text
            and "seed of the random inputs" in text
        )


def subcommand_parsers() -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices)


def typos() -> list[tuple[str, str, str]]:
    """``(command, option, typo)`` for every long option each subcommand shows: the option with the letter
    after its dashes doubled."""
    found = []
    for command, parser in subcommand_parsers().items():
        for action in parser._actions:
            if action.help is argparse.SUPPRESS:
                continue
            found += [(command, o, f"--{o[2]}{o[2:]}") for o in action.option_strings if o.startswith("--")]
    return found


def test_a_typo_in_any_option_is_named_before_any_required_complaint(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Regression: ``split m.onnx --stags 3`` said ``the following arguments are required: --stages/-k``,
    hiding the typo.  Every subcommand's every option, misspelt with nothing else given (no positional, no
    required option): the line names the typo and the option meant, exit 2 (a usage error)."""
    wrong = []
    for command, option, typo in typos():
        code, out, err = run([command, typo, "1"], capfd)
        line = one_line_error(err, command)
        if code != 2 or out or f"error: unknown option {typo} (did you mean {option}?)" not in line:
            wrong.append((command, typo, code, line))
    assert wrong == []
    assert len(typos()) > 100, "expected every subcommand's options"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["split", "m.onnx", "--stags", "3"],
            "onnxpipe split: error: unknown option --stags (did you mean --stages?)",
        ),
        (
            ["split", "m.onnx", "-k", "3", "--ouput", "x"],
            "onnxpipe split: error: unknown option --ouput (did you mean --out?)",
        ),
        (["split", "m.onnx", "--stags=3"], "unknown option --stags (did you mean --stages?)"),
        (
            ["generate", "d", "--temprature", "0.5"],
            "unknown option --temprature (did you mean --temperature?)",
        ),
        (["split", "m.onnx", "-k3", "--out", "o", "-x"], "onnxpipe split: error: unknown option -x; see"),
        (["run", "d", "--bogus"], "onnxpipe run: error: unknown option --bogus; see 'onnxpipe run --help'"),
        (["--verison", "split"], "onnxpipe: error: unknown option --verison (did you mean --version?)"),
    ],
)
def test_unknown_options_are_named(args: list[str], says: str, capfd: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(args, capfd)
    assert code == 2 and out == ""
    assert says in err and "required" not in err


@pytest.mark.parametrize(
    "args",
    [
        ["split", "m.onnx", "-k", "2", "--out", "o", "--", "-notanoption"],  # after --: a value
        ["generate", "d", "--temperature", "-1"],  # a negative number: a value (refused as a value)
        ["generate", "d", "--prompt", "-a prompt with spaces"],  # argparse reads it as a value
    ],
)
def test_values_that_start_with_a_dash_are_not_taken_for_unknown_options(
    args: list[str], capfd: pytest.CaptureFixture[str]
) -> None:
    _code, _out, err = run(args, capfd)
    assert "unknown option" not in err


def test_say_counts_from_the_commands_start() -> None:
    """The time a command prints counts from when it began (set by ``main``), not from when its work
    module, having loaded onnx and onnxruntime, made its :class:`Say`."""
    assert COMMAND_START.get() is None
    started = COMMAND_START.set(12.5)
    try:
        assert Say("split").start == 12.5
    finally:
        COMMAND_START.reset(started)
    assert process_start() <= IMPORTED  # this process began before it imported this module
