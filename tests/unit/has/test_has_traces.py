"""Traces: format detection, the three readers, the LLM mapping, the generator, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from has.sim.traces import (
    MAPPING_MODELS,
    TraceError,
    detect_format,
    llm_job,
    min_reference_gpus,
    read_trace,
    round_request,
    synthetic,
    write_trace,
)

REPO = Path(__file__).resolve().parents[3]


def _gavel(tmp_path: Path, lines: list[str]) -> Path:
    table = {"v100": {"('ResNet-50 (batch size 64)', 1)": 2.0, "('ResNet-50 (batch size 64)', 4)": 6.0}}
    (tmp_path / "v100_throughputs.json").write_text(json.dumps(table))
    p = tmp_path / "vc.trace"
    p.write_text("".join(lines))
    return p


def _line(steps: int, at: float, sf: int, jt: str = "ResNet-50 (batch size 64)") -> str:
    return f"{jt}\tcmd %s\t--steps\t1\t{steps}\t{at}\t{sf}\n"


def test_detects_each_format() -> None:
    assert detect_format("job_id,submit_s,model,seq_len,global_batch,tokens,gpu_type,gpus\n") == "frenzy"
    assert detect_format("name,time,application,num_replicas,batch_size\n") == "pollux"
    assert detect_format(_line(10, 0.0, 1)) == "gavel"
    with pytest.raises(TraceError, match="unrecognised trace format"):
        detect_format("a,b,c\n")


def test_gavel_keeps_arrival_count_and_gpu_time(tmp_path: Path) -> None:
    # 7200 steps at 2 steps/s on 1 V100 = 1 h = 1 GPU-hour; 4 GPUs at 6 steps/s: 3600 s x 4.
    p = _gavel(tmp_path, [_line(7200, 30.0, 1), _line(21600, 60.0, 4)])
    jobs = read_trace(p)
    assert [j.submit_s for j in jobs] == [30.0, 60.0]
    assert [j.gpus for j in jobs] == [1, 4]
    for j in jobs:
        assert min_reference_gpus(j.model) <= j.gpus  # the model needs at most the requested count
    # the 4-GPU job is 4x longer in GPU-time, so far more tokens than the 1-GPU job per GPU
    assert jobs[1].tokens > 0 and jobs[0].tokens > 0


def test_gavel_extrapolates_missing_scale_factor_and_names_bad_line(tmp_path: Path) -> None:
    jobs = read_trace(_gavel(tmp_path, [_line(100, 0.0, 16)]))  # 16 from the 4-GPU entry x 4
    assert jobs[0].gpus == 16
    p = _gavel(tmp_path, [_line(100, 0.0, 1), "X\tcmd\t--s\t1\tnot-a-number\t0\t1\n"])
    with pytest.raises(TraceError, match=r"vc.trace:2: field total_steps"):
        read_trace(p)
    p = _gavel(tmp_path, [_line(100, 0.0, 1, jt="Unknown (batch size 1)")])
    with pytest.raises(TraceError, match=r"vc.trace:1: job_type 'Unknown"):
        read_trace(p)


def test_pollux_reader_and_errors(tmp_path: Path) -> None:
    p = tmp_path / "w.csv"
    p.write_text(
        "name,time,application,num_replicas,batch_size\nbert-0,5,bert,6,32\ncifar10-1,9,cifar10,1,64\n"
    )
    jobs = read_trace(p)
    assert [(j.job_id, j.submit_s, j.gpus) for j in jobs] == [("bert-0", 5.0, 4), ("cifar10-1", 9.0, 1)]
    p.write_text("name,time,application,num_replicas,batch_size\nx-0,5,resnet9000,1,32\n")
    with pytest.raises(TraceError, match=r"w.csv:2: field application"):
        read_trace(p)


def test_shipped_traces_read(tmp_path: Path) -> None:
    pollux = read_trace(REPO / "data/traces/pollux/workloads/workload-1.csv")
    assert len(pollux) == 160
    gavel = read_trace(REPO / "data/traces/gavel/msr_philly_seed0/2869ce.trace", max_jobs=50)
    assert len(gavel) == 50


def test_own_format_round_trip_and_max_jobs(tmp_path: Path) -> None:
    jobs = synthetic(12, seed=3)
    p = tmp_path / "t.csv"
    write_trace(jobs, p)
    back = read_trace(p)
    assert [(j.job_id, j.model, j.tokens, j.gpus) for j in back] == [
        (j.job_id, j.model, j.tokens, j.gpus) for j in jobs
    ]
    assert len(read_trace(p, max_jobs=5)) == 5


def test_own_format_errors_name_job_and_field(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    head = "job_id,submit_s,model,seq_len,global_batch,tokens,gpu_type,gpus\n"
    p.write_text(head + "a,0,no-such-model,2048,64,1000,,1\n")
    with pytest.raises(TraceError, match=r"job 1 \(a\): field model: unknown model 'no-such-model'"):
        read_trace(p)
    p.write_text(head + "a,0,gpt2-124m,1024,64,1000,ZZ-GPU,1\n")
    with pytest.raises(TraceError, match=r"field gpu_type: unknown GPU 'ZZ-GPU'"):
        read_trace(p)
    p.write_text(head + "a,zero,gpt2-124m,1024,64,1000,,1\n")
    with pytest.raises(TraceError, match=r"field submit_s: expected a number"):
        read_trace(p)
    p.write_text(head + "a,0,gpt2-124m,4096,64,1000,,1\n")  # longer than gpt2's positions
    with pytest.raises(TraceError, match=r"job 1 \(a\).*seq_len"):
        read_trace(p)


def test_mapping_is_deterministic_and_sized() -> None:
    assert round_request(7) == 4 and round_request(64) == 64 and round_request(100) == 64
    a = llm_job("vc-17", 0.0, 4, 3600.0 * 4, "t")
    b = llm_job("vc-17", 0.0, 4, 3600.0 * 4, "t")
    assert a == b
    for n in (1, 2, 4, 8, 16):
        j = llm_job(f"j{n}", 0.0, n, 3600.0 * n, "t")
        assert j.model in MAPPING_MODELS and min_reference_gpus(j.model) <= n


def test_synthetic_same_seed_same_jobs() -> None:
    assert synthetic(20, seed=1) == synthetic(20, seed=1)
    assert synthetic(20, seed=1) != synthetic(20, seed=2)
    jobs = synthetic(50, seed=0, jobs_per_hour=10)
    assert all(b.submit_s >= a.submit_s for a, b in zip(jobs, jobs[1:], strict=False))
