"""The subcommands: each one's name, line in ``onnxpipe --help``, the model or folder it is given and its
table of flags (:class:`~onnxpipe.cli.flags.Subcommand`), in the order ``onnxpipe --help`` lists them.

Parsers only: argparse, the door's light options and core; the work of each is
:data:`onnxpipe.cli.WORK` under the same name.
"""

from __future__ import annotations

from pathlib import Path

from onnxpipe.api.options import (
    DEFAULT_ROUNDS,
    GenerateOptions,
    InspectOptions,
    LinkOptions,
    PlanOptions,
    ProfileOptions,
    RunOptions,
    SplitOptions,
    TritonOptions,
    VerifyOptions,
)
from onnxpipe.cli.arguments import (
    INPUT_FLAGS,
    JSON,
    LOCAL_MODES,
    PLANNING_FLAGS,
    QUIET,
    RAY_ADDRESS,
    TOLERANCE_FLAGS,
    byte_sizes,
    count,
    measure_flags,
    positive_int,
    positive_number,
    probability,
    ray_flags,
    shape_flag,
    token_ids,
)
from onnxpipe.cli.flags import Subcommand, flag, grouped, negated, word
from onnxpipe.core.options import render

PROFILE = Subcommand(
    "profile",
    "measure every node's time with onnxruntime and save it",
    "model",
    ProfileOptions,
    [
        flag("--out", "-o", required=True, help="profile JSON to write"),
        flag("--cost", help="measure, or static FLOPs"),
        flag("--force", action="store_true", help="overwrite an existing profile file"),
        QUIET,
        flag(
            "--runtime",
            help="measure on this runtime (default onnxruntime); openvino and tract: the whole model timed, "
            "their per-layer reports mapped back to nodes where they name them (docs/runtimes.md)",
        ),
        flag("--openvino-device", metavar="DEVICE", help="OpenVINO device for --runtime openvino"),
        *measure_flags(prefix="", devices=False),
    ],
)


EMBEDDING = flag(
    "--embedding",
    metavar="FILE.onnx",
    help="the embedding model of a text model that takes inputs_embeds (token ids in, inputs_embeds out; "
    "default: the one the genai_config.json beside the model names): joined ahead of it, so that the split "
    "takes token ids and the planner places the embedding as a decoder's (--ends)",
)


SPLIT = Subcommand(
    "split",
    "partition the model into K balanced stages and export them",
    "model",
    SplitOptions,
    [
        flag("--out", "-o", help="folder to write stages and manifest.json into"),
        *PLANNING_FLAGS,
        flag(
            "--external-data",
            field="export.external_data",
            help="store stage weights in separate files",
        ),
        flag("--force", field="export.force", action="store_true", help="replace a non-empty output folder"),
        flag(
            "--static",
            action="store_true",
            help="freeze the input shapes (--shape, else the defaults) and fold the shape arithmetic and the "
            "Ifs on shapes: every stage's inputs and outputs get fixed shapes (the plan's notes name any "
            "whose size follows data), for runtimes and NPUs that need them",
        ),
        flag(
            "--genai-config",
            field="export.genai_config",
            metavar="FILE",
            help="the model's genai_config.json or Hugging Face config.json (default: the one beside the "
            "model): the genai_config.json written for a decoder (ONNX Runtime GenAI's decoder-pipeline) "
            "keeps its token ids and search options; without one they are derived from the graph and "
            "defaults",
        ),
        EMBEDDING,
        *TOLERANCE_FLAGS,
        negated("--no-verify", "verify", "skip comparing the stages with the model"),
        flag(
            "--calibrate",
            field="calibration.rounds",
            type=positive_int,
            nargs="?",
            const=DEFAULT_ROUNDS,
            metavar="ROUNDS",
            help=f"time the stages, correct the costs and split again (default {DEFAULT_ROUNDS} rounds when "
            "given)",
        ),
        flag(
            "--calibrate-in",
            field="calibration.mode",
            help="time each stage alone (default), or the stages running together as a pinned thread "
            "pipeline; auto: as a pipeline when there is a physical core for every stage thread; ray: as a "
            "pipeline on a Ray cluster, each stage on the node it will run on",
        ),
        flag(
            "--ray-address",
            field="calibration.ray_address",
            metavar="ADDR",
            help="with --calibrate-in ray: the Ray cluster (default: start a local one)",
        ),
        flag(
            "--ray-resources",
            field="calibration.ray_resources",
            metavar="FILE",
            help="with --calibrate-in ray: JSON file of per-stage Ray actor resources, as run takes",
        ),
        QUIET,
        *measure_flags(),
        JSON,
    ],
)


PLAN = Subcommand(
    "plan",
    "plan stages for a cluster and print (and draw) the plan",
    "model",
    PlanOptions,
    [
        *PLANNING_FLAGS,
        flag("--plot", help="draw the schedule and the stage loads (.png or .svg)"),
        EMBEDDING,
        QUIET,
        *measure_flags(),
        JSON,
    ],
)


VERIFY = Subcommand(
    "verify",
    "check that the chained stages reproduce the model's outputs",
    "dir",
    VerifyOptions,
    [
        flag("--model", help="the source model (default: the path in the manifest)"),
        *TOLERANCE_FLAGS,
        flag("--seed", type=int, help="seed of the random inputs both models are run on"),
        flag(
            "--runtime",
            help="run every stage on this runtime, or 'devices': each on its device's runtime (a split made "
            "with --devices); default: onnxruntime on the CPU.  The original always runs in onnxruntime",
        ),
        flag("--threads", type=positive_int, help="threads each stage runs with (default 1)"),
        shape_flag(),
        *INPUT_FLAGS,
        JSON,
    ],
)


_RUN_WORKERS = [
    flag("--backend", help="local workers or a Ray cluster"),
    flag("--local-mode", choices=LOCAL_MODES, help="local workers as processes (shared memory) or threads"),
    flag(
        "--threads",
        type=positive_int,
        metavar="N",
        help="intra-op threads per stage (default: the split's devices', else the plan's)",
    ),
    flag(
        "--devices",
        type=Path,
        metavar="FILE",
        help="devices file naming each stage's provider and threads (default: the split's, docs/devices.md)",
    ),
    flag("--slots", type=positive_int, metavar="N", help="micro-batches each link between stages holds"),
    flag(
        "--pin",
        action="store_true",
        help="pin each local worker (and, with --compare, each baseline) to CPUs of its own, on "
        "physical cores no other worker uses",
    ),
    *ray_flags("run", "its micro-batches sent again"),
]
_RUN_INPUTS = [
    *INPUT_FLAGS,
    flag(
        "--microbatches",
        "-m",
        type=positive_int,
        metavar="M",
        help="micro-batches to run (default: all the inputs hold, else 32)",
    ),
    flag("--warmup", type=count, metavar="W", help="untimed micro-batches run first"),
    shape_flag("shape of a random model input (default: the shapes the plan was made for)"),
    flag("--seed", type=int, help="seed of the random inputs"),
    flag("--model", help="the source model (default: the path in the manifest)"),
]
_RUN_RESULTS = [
    flag("--report", metavar="FILE.json", help="write the measurements as JSON"),
    flag(
        "--outputs",
        metavar="FILE.npz",
        help="write the model outputs as .npz, stacked on axis 0",
    ),
    flag(
        "--compare",
        action="store_true",
        help="also run the model as one session (1 thread, all threads) and as K replicas",
    ),
]

RUN = Subcommand(
    "run",
    "run a split folder as a pipeline and measure it",
    "dir",
    RunOptions,
    [
        *grouped("workers", _RUN_WORKERS),
        *grouped("inputs", _RUN_INPUTS),
        *grouped("results", _RUN_RESULTS),
        JSON,
    ],
    target_help="a folder written by 'onnxpipe split'",
)


GENERATE = Subcommand(
    "generate",
    "generate tokens through a decoder's split, each worker keeping its layers' KV cache",
    "dir",
    GenerateOptions,
    [
        flag(
            "--prompt",
            field="prompts",
            action="append",
            metavar="TEXT",
            help="a prompt as text, encoded by the model's tokenizer; its answer is printed as text as it is "
            "made (repeat the option for several sequences in flight)",
        ),
        flag(
            "--inputs",
            action="append",
            metavar="FILE.npz",
            help="an encoder-decoder split's encoder inputs (e.g. input_features), a sequence per row, "
            "in place of prompts (repeatable)",
        ),
        flag(
            "--prompt-ids",
            type=token_ids,
            action="append",
            metavar="IDS",
            help="a prompt's token ids, comma-separated (repeatable), instead of --prompt",
        ),
        flag(
            "--chat",
            action="store_true",
            help="wrap each --prompt in the model's chat template as a user's message, the assistant's turn "
            "opened",
        ),
        flag("--system", metavar="TEXT", help="with --chat: a system message before each prompt"),
        flag(
            "--tokenizer",
            metavar="DIR",
            help="the folder of the model's tokenizer files (tokenizer.json, tokenizer_config.json; default: "
            "the split's folder, else the source model's)",
        ),
        flag("--max-new-tokens", type=positive_int, metavar="N", help="new tokens per prompt"),
        flag(
            "--eos-token-id",
            field="eos_token_ids",
            type=count,
            action="append",
            metavar="ID",
            help="stop a sequence at this token (repeatable; default: the model's end ids, from the GenAI "
            "config its builder wrote, else its Hugging Face configs or tokenizer)",
        ),
        flag(
            "--ignore-eos",
            action="store_true",
            help="make every sequence --max-new-tokens long, whatever tokens come",
        ),
        flag(
            "--in-flight",
            type=positive_int,
            metavar="N",
            help="sequences in the pipeline at once (default: every prompt)",
        ),
        flag(
            "--batch",
            type=positive_int,
            metavar="N",
            help="sequences a decode step carries at most, their caches padded (default: those in flight "
            "over the stages, a step per stage; 1: a step per sequence)",
        ),
        flag(
            "--do-sample",
            action="store_true",
            help="draw each token from the softmax of the logits instead of taking the highest (greedy, the "
            "default), seeded per sequence: the same --seed gives the same tokens through the split and the "
            "unsplit model",
        ),
        flag(
            "--temperature",
            type=positive_number,
            metavar="T",
            help="with --do-sample: logits over T (default 1.0)",
        ),
        flag(
            "--top-k",
            type=count,
            metavar="K",
            help="with --do-sample: only the K most likely tokens (default 0: all)",
        ),
        flag(
            "--top-p",
            type=probability,
            metavar="P",
            help="with --do-sample: only the most likely tokens whose probabilities reach P (default 1.0: "
            "all)",
        ),
        flag("--seed", type=count, metavar="S", help="with --do-sample: the generators' seed (default 0)"),
        flag("--local-mode", choices=LOCAL_MODES, help="workers as processes (shared memory) or threads"),
        flag(
            "--threads",
            type=positive_int,
            metavar="N",
            help="intra-op threads per worker (default: the split's devices', else the plan's)",
        ),
        flag(
            "--backend",
            help="local workers or Ray actors on a cluster, each keeping its stage's cache",
        ),
        *ray_flags("generation", "the sequences whose caches it held rebuilt there by a prefill"),
        flag(
            "--compare",
            action="store_true",
            help="also generate the same prompts with the unsplit model (a plain loop in this process) and "
            "with K replicas of it (on --backend: Ray places them itself), side by side: the tokens must be "
            "the same (exit 1 if not), and tokens/s of each are reported",
        ),
        flag("--model", help="the source model for --compare (default: the manifest's)"),
        flag(
            "--embedding",
            metavar="FILE.onnx",
            help="the embedding model of a split that takes inputs_embeds (token ids in, inputs_embeds out; "
            "default: the one the folder's genai_config.json names), run before each step",
        ),
        JSON,
    ],
    target_help="a folder written by 'onnxpipe split' from a decoder LLM",
)


LINKS = Subcommand(
    "links",
    "measure a devices file's links on a Ray cluster and write them into it",
    "devices",
    LinkOptions,
    [
        RAY_ADDRESS,
        flag(
            "--ray-resources",
            metavar="FILE",
            help="JSON file of each device's Ray resources, in pipeline order (as run takes per stage): "
            "they put each device's probe on its node",
        ),
        flag(
            "--split",
            metavar="DIR",
            help="a split folder: each link is timed with the bytes its stages send across it",
        ),
        flag(
            "--bytes",
            field="sizes",
            type=byte_sizes,
            metavar="N[,N...]",
            help="sizes to time each link at, in bytes or as '4 MiB' (default: the split's boundaries, "
            "else 64 KiB, 1 MiB and 4 MiB)",
        ),
        flag(
            "--repeats",
            type=positive_int,
            metavar="N",
            help="transfers per size, one at a time; their median counts",
        ),
        flag(
            "--out",
            metavar="FILE.json",
            help="write the devices file again, its links the measured ones",
        ),
        JSON,
    ],
    target_help="a devices file (docs/devices.md), devices in pipeline order",
)


INSPECT = Subcommand(
    "inspect",
    "print a table of a split folder's stages, or of a model",
    "target",
    InspectOptions,
    [
        negated(
            "--no-file-check",
            "check_files",
            "do not hash the stage files against the manifest (a large split, looked at quickly)",
        ),
        JSON,
    ],
    target_help="a folder written by 'onnxpipe split', or an .onnx model",
)


EXPORT_TRITON = Subcommand(
    "export-triton",
    "write a Triton model repository (a model per stage and an ensemble) from a split folder",
    "dir",
    TritonOptions,
    [
        flag("--out", help="the repository folder to write"),
        flag("--name", help="the ensemble's name (default: the source model's file stem)"),
        flag(
            "--platform",
            help="what runs each stage: onnxruntime_onnx or the openvino backend; auto: each stage's "
            "runtime in the manifest (default)",
        ),
        flag(
            "--max-batch-size",
            type=positive_int,
            help="max_batch_size when every tensor has its batch at axis 0; else the configs say 0 and list "
            "full dims",
        ),
        flag("--force", action="store_true", help="replace an earlier repository in --out"),
    ],
    target_help="a folder written by onnxpipe split",
)


SUBCOMMANDS = (PROFILE, SPLIT, PLAN, VERIFY, RUN, GENERATE, LINKS, INSPECT, EXPORT_TRITON)


def worded(text: str, command: str) -> str:
    """``text`` with every option it names worded as a flag (``--stages 2``): as ``command``'s flag where it
    has one, else as the flag another subcommand sets it with."""
    tables = sorted(SUBCOMMANDS, key=lambda c: command != c.name)  # its own first
    return render(text, lambda ref: word(ref, tables))
