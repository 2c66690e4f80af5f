"""The job's GPU memory from an NVML reading (peak.py), and what a job declares in its run directory."""

from __future__ import annotations

from pathlib import Path

from frenzy.agent import launcher
from frenzy.agent.gpus import GpuInfo
from frenzy.agent.peak import job_gpu_bytes

GiB = 2**30


def gpu(index: int, used: int, procs: tuple[tuple[int, int], ...] = (), total: int = 80 * GiB,
        healthy: bool = True) -> GpuInfo:
    return GpuInfo(index, f"GPU-{index}", "NVIDIA A100-SXM4-80GB", "A100-80GB", total, total - used, healthy,
                   processes=procs)


def test_the_jobs_own_processes_count_on_its_gpus_only() -> None:
    gpus = [gpu(0, 70 * GiB, ((10, 30 * GiB), (11, 5 * GiB), (99, 35 * GiB))),  # 99: not the job's
            gpu(1, 60 * GiB, ((10, 40 * GiB),)),
            gpu(2, 79 * GiB, ((50, 79 * GiB),))]  # another job's GPU
    assert job_gpu_bytes(gpus, (0, 1), {10, 11}) == (40 * GiB, 80 * GiB)


def test_without_a_matching_process_the_gpus_used_memory_counts() -> None:
    # A container's pid namespace: NVML names host pids the agent does not know.
    gpus = [gpu(0, 20 * GiB, ((4242, 19 * GiB),)), gpu(1, 22 * GiB, ((4243, -1),))]
    assert job_gpu_bytes(gpus, (0, 1), {10}) == (22 * GiB, 80 * GiB)
    assert job_gpu_bytes([gpu(0, 20 * GiB, healthy=False)], (0,), {10}) == (0, 0)
    assert job_gpu_bytes(gpus, (), {10}) == (0, 0)


def test_a_declared_peak_is_read_from_the_run_directory(tmp_path: Path) -> None:
    log = tmp_path / "attempt-1" / "n1.log"
    run = launcher.run_dir_for(log)
    assert run == tmp_path / "attempt-1" / "n1.run"
    assert launcher.read_declared_peak(log) == 0  # nothing written
    run.mkdir(parents=True)
    (run / launcher.PEAK_FILE).write_text("8500000000\n")
    assert launcher.read_declared_peak(log) == 8_500_000_000
    (run / launcher.PEAK_FILE).write_text("7.5e9")
    assert launcher.read_declared_peak(log) == 7_500_000_000
    for bad in ("lots", "-5", "", "1e40"):
        (run / launcher.PEAK_FILE).write_text(bad)
        assert launcher.read_declared_peak(log) == 0, bad


def test_the_end_of_a_log_drops_its_cut_first_line(tmp_path: Path) -> None:
    log = tmp_path / "n.log"
    log.write_text("".join(f"line {i:04d}\n" for i in range(10_000)))
    end = launcher.read_log_end(log, max_bytes=1000)
    assert end.endswith("line 9999\n") and end.startswith("line ") and len(end) <= 1000
    assert launcher.read_log_end(tmp_path / "missing.log") == ""
