"""The measurements of ``onnxpipe run``: what each number is computed from, not how fast anything runs.

Most tests feed synthetic worker records to :mod:`onnxpipe.runtime.report` and check the logic (which
clock a rate comes from, what the estimates are compared with, what memory may be compared); a few run
the tiny sample split to check the report's structure end to end.
"""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
from runtime_support import (
    CPU,
    FakeBackend,
    FakePipeline,
    as_pipeline,
    entry,
    measurement,
    spec,
    stats,
    token_batches,
)

from onnxpipe.cluster.model import Device
from onnxpipe.core.runtime_kinds import EngineConfig
from onnxpipe.runtime.backends.ray_resources import Recovery
from onnxpipe.runtime.report import baselines as compare
from onnxpipe.runtime.report.build import build_report
from onnxpipe.runtime.report.measure import min_steady_microbatches
from onnxpipe.runtime.report.text import format_report, memory_line, versus_estimate, workers_text
from onnxpipe.runtime.spec import (
    CUDA_PROVIDER,
    Placement,
    WorkerSpec,
)
from onnxpipe.runtime.trips import NodePlace


def test_steady_throughput_comes_from_the_last_workers_records() -> None:
    """Regression: outputs collected in one poll shared the driver's timestamp, which inflated the rate."""
    n = 12
    last = [10.0 + j for j in range(n)]  # the last worker finishes one micro-batch a second
    # the driver collected them in bursts: pairs share one poll's time, the first pair late
    polls = [11.0, 11.0, 12.0, 13.0, 14.0, 14.0, 16.0, 16.0, 18.0, 18.0, 21.0, 21.0]
    m = measurement(n, (stats(0, [5.0 + j for j in range(n)]), stats(1, last)), driver_done=polls)
    assert m.steady_throughput_from == "worker"
    assert m.steady_throughput_per_s == pytest.approx(1.0)
    assert (n - 1) / (polls[-1] - polls[0]) != pytest.approx(1.0)  # what the driver's times would say


def test_steady_throughput_falls_back_to_the_driver_without_records() -> None:
    n = 12
    empty = (stats(0, []), stats(1, []))
    m = measurement(n, empty, driver_done=[2.0 * j for j in range(n)])
    assert m.steady_throughput_from == "driver"
    assert m.steady_throughput_per_s == pytest.approx(0.5)


def test_steady_throughput_is_none_below_the_minimum() -> None:
    k = 2
    assert min_steady_microbatches(k) == 2 * k + 2
    n = min_steady_microbatches(k) - 1
    m = measurement(n, (stats(0, [float(j) for j in range(n)]), stats(1, [float(j) for j in range(n)])))
    assert m.steady_throughput_per_s is None and m.steady_throughput_from is None
    fake = FakePipeline(lanes=((spec(0), spec(1)),), backend=FakeBackend("threads"))
    report = build_report(as_pipeline(fake), m, warmup=0, input_shapes={})
    obj = report.to_obj()
    assert obj["steady_throughput_per_s"] is None and obj["throughput_per_s"] > 0
    assert any("no steady throughput" in note for note in report.notes)
    assert "too few for a steady rate" in format_report(report)
    json.loads(report.to_json())  # null, not NaN


def test_steady_throughput_merges_every_lanes_last_worker() -> None:
    """Replicas are K one-worker lanes: the outputs leave from every lane."""
    n = 8
    a = [float(j) for j in range(0, n, 2)]  # 0, 2, 4, 6
    b = [float(j) for j in range(1, n, 2)]  # 1, 3, 5, 7
    m = measurement(n, (stats(0, a), stats(1, b)), output_workers=(0, 1))
    assert m.steady_throughput_per_s == pytest.approx(1.0)
    only_last = measurement(n, (stats(0, a), stats(1, b)), output_workers=(1,))
    assert only_last.steady_throughput_per_s == pytest.approx(3 / 6)


def test_the_report_labels_latency_at_saturation_and_one_at_a_time() -> None:
    n = 12
    m = measurement(
        n, (stats(0, [float(j) for j in range(n)]), stats(1, [float(j) for j in range(n)])), single=(0.002,)
    )
    fake = FakePipeline(lanes=((spec(0), spec(1)),), backend=FakeBackend("threads"))
    report = build_report(as_pipeline(fake), m, warmup=0, input_shapes={})
    obj = report.to_obj()
    assert obj["latency_in_flight"] == 6
    assert set(obj["latency_ms"]) == {"mean", "p50", "p90", "p99", "max"}
    assert obj["latency_single_ms"]["p50"] == pytest.approx(2.0)
    text = format_report(report)
    assert "latency at saturation (6 in flight)" in text and "one at a time p50 2.00 ms" in text
    without = build_report(as_pipeline(fake), measurement(n, m.stats), warmup=0, input_shapes={})
    assert without.to_obj()["latency_single_ms"] is None and "one at a time" not in format_report(without)


def test_distinct_drops_repeats_of_the_same_feeds_only() -> None:
    a, b = token_batches(2)
    twin = {n: v.copy() for n, v in a.items()}  # equal values, another request: checked again
    assert compare.distinct([a, b, a, twin, b]) == [a, b, twin]
    assert [id(f) for f in compare.distinct([a, b, a, twin, b])] == [id(a), id(b), id(twin)]


def _on(index: int, placement: Placement, device: str) -> WorkerSpec:
    """Stage ``index`` on ``device`` (as its manifest names it), run with ``placement``."""
    return spec(index, placement, entry(index, 1.0, device=device))


def test_baselines_run_on_the_stages_provider() -> None:
    gpu = Placement(CUDA_PROVIDER, (("device_id", "1"),), 2)
    place, note = compare.baseline_placement([_on(0, gpu, "cuda:1"), _on(1, gpu, "cuda:1")])
    assert place == Placement(CUDA_PROVIDER, (("device_id", "1"),), 1) and note is None
    place, note = compare.baseline_placement([_on(0, Placement(CPU, (), 2), "cpu0"), _on(1, gpu, "cuda:1")])
    assert place.provider == CPU
    assert note is not None and CUDA_PROVIDER in note and "first stage's" in note


def test_replicas_share_the_pipelines_threads() -> None:
    for stage_threads in ([1, 1], [2, 1], [3, 1, 1], [5, 1], [1, 1, 1, 4]):
        split = compare.replica_threads(stage_threads)
        assert len(split) == len(stage_threads)
        assert sum(split) == sum(stage_threads)
        assert max(split) - min(split) <= 1 and min(split) >= 1
    assert compare.replica_threads([3, 1, 1]) == [2, 2, 1]


def test_replicas_run_as_the_pipelines_workers_do() -> None:
    def mode(kind: str) -> str:
        return compare.replica_mode(as_pipeline(FakePipeline(lanes=(), backend=FakeBackend(kind))))

    assert mode("threads") == "threads"
    assert mode("processes") == "processes"
    assert mode("ray") == "ray"


def test_memory_line_without_baselines() -> None:
    n = 12
    ws = tuple(stats(i, [float(j) for j in range(n)], shared=False) for i in (0, 1))
    fake = FakePipeline(lanes=((spec(0), spec(1)),), backend=FakeBackend("processes"))
    assert memory_line(build_report(as_pipeline(fake), measurement(n, ws), warmup=0, input_shapes={})) is None


def test_a_workers_model_memory_leaves_out_its_channels_shared_memory() -> None:
    base = stats(0, [0.0], shared=False, peak=1000, startup=100)
    assert base.model_rss_bytes == 900
    assert replace(base, shared_memory_bytes=300).model_rss_bytes == 600
    assert replace(base, shared_memory_bytes=5000).model_rss_bytes == 0  # never below nothing


def test_a_pipeline_slower_than_a_baseline_gets_a_verdict_that_says_so() -> None:
    from onnxpipe.runtime.report.model import BaselineReport

    n = 12
    m = measurement(n, (stats(0, [float(j) for j in range(n)]), stats(1, [float(j) for j in range(n)])))
    fake = FakePipeline(lanes=((spec(0), spec(1)),), backend=FakeBackend("threads"))
    report = build_report(as_pipeline(fake), m, warmup=0, input_shapes={})
    one = BaselineReport("single", "one session, 1 thread", 1, 1, 100.0, pipeline_speedup=0.55)
    fast = replace(one, name="all", pipeline_speedup=1.4)
    slower = format_report(replace(report, baselines={"single": one, "all": fast}))
    assert "verdict: the pipeline is SLOWER than single (one session, 1 thread): 0.55x" in slower
    assert "measured vs est" in slower
    faster = format_report(replace(report, baselines={"all": fast}))
    assert "verdict: the pipeline is faster than every baseline (at least 1.40x)" in faster


def test_a_one_stage_split_slower_than_a_session_is_not_told_to_split_less() -> None:
    """The quick start: ``--stages auto`` chose one stage because a pipeline does not pay here, so the
    verdict on it names the runner's own cost rather than a pipeline being slower (issue 39)."""
    from onnxpipe.runtime.report.model import BaselineReport

    n = 12
    m = measurement(n, (stats(0, [float(j) for j in range(n)]),))
    fake = FakePipeline(lanes=((spec(0),),), backend=FakeBackend("threads"))
    report = build_report(as_pipeline(fake), m, warmup=0, input_shapes={})
    one = BaselineReport("single", "one session, 1 thread", 1, 1, 100.0, pipeline_speedup=0.8)
    text = format_report(replace(report, baselines={"single": one}))
    assert "verdict: one stage, so nothing runs at once" in text
    assert "0.80x the throughput of single (one session, 1 thread)" in text
    assert "SLOWER" not in text


@pytest.mark.parametrize(
    ("estimated", "measured", "says"),
    [
        (1.0, 4.1, "4.1x slower"),  # a busy machine: was "(est-meas)/meas -75.6%"
        (5.116, 1.0, "5.1x faster"),  # was "+411.6%", which read as the opposite
        (1.0, 1.06, "6% slower"),
        (1.0, 0.9, "10% faster"),
        (1.0, 1.001, "as estimated"),
    ],
)
def test_a_measured_time_against_its_estimate_reads_in_words(
    estimated: float, measured: float, says: str
) -> None:
    assert versus_estimate((estimated - measured) / measured) == says
    assert versus_estimate(None) == "-"


def test_workers_are_counted_in_words() -> None:
    """Regression: ``on 2 threads workers``."""
    assert workers_text(2, "threads") == "2 thread workers"
    assert workers_text(1, "processes") == "1 worker process"
    assert workers_text(3, "processes") == "3 worker processes"
    assert workers_text(2, "ray") == "2 Ray actors"


def test_the_report_says_how_its_stages_ran_against_their_estimates_in_words() -> None:
    n = 12
    m = measurement(n, (stats(0, [float(j) for j in range(n)]), stats(1, [float(j) for j in range(n)])))
    fake = FakePipeline(lanes=((spec(0), spec(1)),), backend=FakeBackend("threads"))
    report = build_report(as_pipeline(fake), m, warmup=0, input_shapes={})
    text = format_report(replace(report, machine_slowdown=4.1))
    assert " on 2 thread workers: " in text and "threads workers" not in text
    assert "(est-meas)" not in text and "measured vs est" in text
    assert (
        "machine: the whole model on one thread ran 4.10x slower than when the estimates were made: other"
        in text
    )
    faster = format_report(replace(report, machine_slowdown=0.5))
    assert "ran 2.00x faster than when the estimates were made: the machine was busier then" in faster


def test_a_recovery_reads_in_the_report_and_its_json_as_before() -> None:
    """The backend's own record of a lost actor brought back is what the report holds; its JSON keys
    flatten the two nodes (``host (address, node id)`` and the id), as they always did."""
    m = measurement(4, (stats(0, [0.0] * 4), stats(1, [0.0] * 4)))
    fake = FakePipeline(lanes=((spec(0), spec(1)),), backend=FakeBackend("threads"))
    lost, now = NodePlace("a" * 12, "10.0.0.1", "one", 7), NodePlace("b" * 12, "10.0.0.2", "two", 8)
    report = replace(
        build_report(as_pipeline(fake), m, warmup=0, input_shapes={}),
        recoveries=(Recovery((1,), lost, now, True, 3, 2.5),),
    )
    assert report.to_obj()["recoveries"] == [
        {
            "stages": [1],
            "lost_node": "one (10.0.0.1, node aaaaaaaa)",
            "lost_node_id": "a" * 12,
            "new_node": "two (10.0.0.2, node bbbbbbbb)",
            "new_node_id": "b" * 12,
            "node_died": True,
            "replayed": 3,
            "seconds_lost": 2.5,
        }
    ]
    assert (
        "recovered: stage 1 lost its node one (10.0.0.1, node aaaaaaaa); running again on "
        "two (10.0.0.2, node bbbbbbbb) 2.5 s later, 3 micro-batch(es) sent again"
    ) in format_report(report)


def test_a_stage_spec_reads_its_device_and_files_off_the_manifests_record() -> None:
    record = replace(entry(3, 1.0, device="cuda:1"), external_data="s3.data", external_data_sha256="1" * 64)
    stage = spec(3, stage=record)
    assert stage.device == "cuda:1"
    assert [(f.name, f.sha256) for f in stage.files] == [("stage_3.onnx", "0" * 64), ("s3.data", "1" * 64)]
    assert spec(0).device == "cpu" and spec(0).files == ()  # a replica's: no record, its files read later


def test_a_hop_longer_than_every_stage_is_named_as_the_bottleneck() -> None:
    """On a slow link the hop between the stages takes longer than either stage: the report names the
    link, its bytes and rate (not a stage, and not "give the stages CPUs"); a quick hop names nothing."""
    from onnxpipe.runtime.report.cluster import HopReport
    from onnxpipe.runtime.report.model import BaselineReport

    m = measurement(4, (stats(0, [0.0] * 4), stats(1, [0.0] * 4)))
    fake = FakePipeline(lanes=((spec(0), spec(1)),), backend=FakeBackend("threads"))
    report = build_report(as_pipeline(fake), m, warmup=0, input_shapes={})
    stage_ms = max(s.handling_ms for s in report.stages)
    hops = (
        HopReport("driver", "stage 0", 1000, 0.2, 0.3),
        HopReport("stage 0", "stage 1", 1_250_000, stage_ms + 100.0, stage_ms + 120.0),
        HopReport("stage 1", "driver", 1000, 0.2, 0.3),
    )
    slow = replace(
        report,
        hops=hops,
        overhead_ms=1.0,
        baselines={"ray": BaselineReport("ray", "2 replicas", 2, 1, 10.0, pipeline_speedup=0.5)},
    )
    assert slow.bounding_hop == hops[1]
    assert slow.to_obj()["bounding_hop"] == "stage 0 -> stage 1"
    text = format_report(slow)
    assert "bottleneck the link stage 0 -> stage 1" in text
    assert "link: stage 0 -> stage 1 bounds the pipeline: 1.2 MiB a micro-batch take" in text
    assert "bounded by the link from stage 0 to stage 1" in text and "CPUs of their own" not in text
    quick = replace(slow, hops=tuple(replace(h, single_ms=0.1) for h in hops))
    assert quick.bounding_hop is None and quick.to_obj()["bounding_hop"] is None
    assert "bottleneck stage" in format_report(quick)


def test_nodes_of_one_machine_are_told_apart_by_their_addresses() -> None:
    """Ray nodes in namespaces of one machine report its host name each: the node column then gives
    each stage's address (and the host once, in the header); nodes of several hosts keep their names."""
    m = measurement(4, (stats(0, [0.0] * 4), stats(1, [0.0] * 4)))
    fake = FakePipeline(lanes=((spec(0), spec(1)),), backend=FakeBackend("threads"))
    report = build_report(as_pipeline(fake), m, warmup=0, input_shapes={})

    def on(*places: tuple[str, str]) -> str:
        stages = [
            replace(s, node=NodePlace(f"{i}" * 12, address, host, 1))
            for i, (s, (host, address)) in enumerate(zip(report.stages, places, strict=True))
        ]
        return format_report(replace(report, stages=stages))

    one_machine = on(("box", "10.1.0.2"), ("box", "10.1.0.3"))
    assert "node (address id, all on host box)" in one_machine
    assert "10.1.0.2 00000000" in one_machine and "10.1.0.3 11111111" in one_machine
    assert "box 10.1.0" not in one_machine
    two_machines = on(("left", "10.1.0.2"), ("right", "10.1.0.3"))
    assert "node (host address id)" in two_machines and "right 10.1.0.3 11111111" in two_machines
    loopback = on(("box", "127.0.0.1"), ("box", "127.0.0.1"))
    assert "node (host address id)" in loopback and "box 127.0.0.1 11111111" in loopback


def test_devices_alike_in_pace_stay_alike_whatever_their_memory_or_provider_options() -> None:
    """The replicas' balanced ceiling applies to devices that run at one pace: a device's memory and its
    provider's options (a GPU's device_id) do not set it; its provider, threads and speeds do."""

    def alike(*devices: Device) -> bool:
        return compare._alike(
            SimpleNamespace(manifest=SimpleNamespace(cluster=SimpleNamespace(devices=devices)))
        )

    cuda = EngineConfig(provider=CUDA_PROVIDER, provider_options=(("device_id", "0"),))
    other = replace(cuda, provider_options=(("device_id", "1"),))
    assert alike(Device("a", memory_bytes=8 << 30), Device("b", memory_bytes=16 << 30))
    assert alike(Device("g0", engine=cuda), Device("g1", engine=other))
    assert not alike(Device("a"), Device("b", speed=2.0))
    assert not alike(Device("a"), Device("b", engine=EngineConfig(threads=4)))
