"""exit_cause: the cause of a job's exit from its status and the real messages frameworks print."""

from __future__ import annotations

import pytest

from frenzy.agent.exit_cause import NEAR_FULL_SHARE, OOM, classify, last_lines, oom_line

# Verbatim (paths and numbers as printed) from PyTorch 2.3's caching allocator.
TORCH_23 = [
    "Traceback (most recent call last):",
    '  File "/workspace/train.py", line 88, in <module>',
    "    loss.backward()",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "79.15 GiB of which 1.23 GiB is free. Process 12345 has 77.91 GiB memory in use. Of the allocated memory "
    "75.12 GiB is allocated by PyTorch, and 1.27 GiB is reserved by PyTorch but unallocated. If reserved but "
    "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
    "fragmentation.  See documentation for Memory Management  "
    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
]
TORCH_20 = ["torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total "
            "capacity; 14.56 GiB already allocated; 3.19 MiB free; 14.69 GiB reserved in total by PyTorch)"]
TORCH_1X = ["RuntimeError: CUDA out of memory. Tried to allocate 256.00 MiB (GPU 0; 10.76 GiB total capacity; "
            "9.51 GiB already allocated; 118.56 MiB free; 9.68 GiB reserved in total by PyTorch)"]
CUDA_ERROR = ["RuntimeError: CUDA error: out of memory",
              "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
              "below might be incorrect."]
CUBLAS = ["RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"]
NCCL = [
    "node-a:1234:1290 [0] include/alloc.h:48 NCCL WARN Cuda failure 'out of memory'",
    "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1275, "
    "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.1",
    "ncclUnhandledCudaError: Call to CUDA function failed.",
    "Last error:",
    "Cuda failure 2 'out of memory'",
]
# torchrun's summary after a worker failed: the OOM is above it, not in the last line.
TORCHRUN_TAIL = [
    *TORCH_23,
    "E0101 12:00:00.000000 139 torch/distributed/elastic/multiprocessing/api.py:826] failed (exitcode: 1) "
    "local_rank: 0 (pid: 140) of binary: /usr/bin/python",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    "============================================================",
    "train.py FAILED",
]


@pytest.mark.parametrize("tail", [TORCH_23, TORCH_20, TORCH_1X, CUDA_ERROR, CUBLAS, NCCL, TORCHRUN_TAIL,
                                  ["HIP out of memory. Tried to allocate 1.00 GiB (GPU 0; 63.98 GiB total capacity)"],
                                  ["jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while "
                                   "trying to allocate 17179869184 bytes."]])
def test_out_of_memory_messages_are_oom(tail: list[str]) -> None:
    assert classify(1, tail) == OOM
    assert oom_line(tail) is not None


def test_oom_line_is_the_last_one_saying_so() -> None:
    assert oom_line(TORCHRUN_TAIL) == TORCH_23[-1]
    assert oom_line(["all good", "loss 1.2"]) is None


@pytest.mark.parametrize("tail", [
    ["MemoryError"],  # host memory: more GPU memory would not help
    ["Traceback (most recent call last):", "ValueError: bad batch"],
    ["step 10 loss 2.31 mem 70.1 GiB"],
    [],
])
def test_other_failures_are_their_exit_code(tail: list[str]) -> None:
    assert classify(2, tail) == "exit code 2"


def test_signals_are_named() -> None:
    assert classify(-9, ["step 1"]) == "signal 9 (SIGKILL)"
    assert classify(-15, []) == "signal 15 (SIGTERM)"
    assert classify(137, []) == "exit code 137 (128 + SIGKILL: a process it ran was killed)"
    assert classify(255, []) == "exit code 255"


def test_success_cancel_and_unknown() -> None:
    assert classify(0, TORCH_23) == ""  # printed an OOM once, recovered, finished: no failure
    assert classify(-15, TORCH_23, cancelled=True) == "cancelled"
    assert classify(None, []) == "exit code unknown"
    assert classify(None, TORCH_23) == OOM


def test_a_gpu_near_full_is_oom_only_when_measured() -> None:
    assert classify(1, [], peak_share=NEAR_FULL_SHARE, gpu_measured=True) == OOM
    assert classify(-6, [], peak_share=0.99, gpu_measured=True) == OOM  # an abort at the peak
    assert classify(1, [], peak_share=NEAR_FULL_SHARE - 0.01, gpu_measured=True) == "exit code 1"
    # What a job declares on fake GPUs is not evidence that a GPU was full.
    assert classify(1, [], peak_share=0.99, gpu_measured=False) == "exit code 1"


def test_last_lines_are_bounded_and_skip_the_agents_lines() -> None:
    text = ("# frenzy agent n1: job j attempt 1 at now\n# cwd=/tmp CUDA_VISIBLE_DEVICES=0\n# argv: python t.py\n"
            + "".join(f"line {i}\n" for i in range(100)) + "# frenzy agent: exited with code 1 at now\n")
    assert last_lines(text, 20, 4096) == [f"line {i}" for i in range(80, 100)]
    short = "# frenzy agent n1: job j\n# cwd=/x\n# argv: python t.py\nonly line\n"
    assert last_lines(short, 20, 4096) == ["only line"]
    huge = "x" * 100_000 + "\n" + "y" * 100_000 + "\n"
    out = last_lines(huge, 20, 4096)
    assert len(out) == 2 and sum(len(s.encode()) + 1 for s in out) <= 4096 and out[0].endswith("…")
    many = "".join("é" * 300 + "\n" for _ in range(50))
    out = last_lines(many, 20, 1024)
    assert sum(len(s.encode()) + 1 for s in out) <= 1024 and out  # multi-byte text stays within the bytes
    assert last_lines("a\nb\n", 0, 100) == []


def test_a_command_the_shim_could_not_execute_is_a_launch_failure_with_its_reason() -> None:
    # What shim.py prints when exec fails after the agent's checks passed (a script without "#!").
    shim = "# frenzy shim: cannot start './train.sh': [Errno 8] Exec format error: './train.sh'"
    assert classify(127, [shim, "# frenzy agent n1: exited with code 127"]) == (
        "launch failed: cannot start './train.sh': [Errno 8] Exec format error: './train.sh'")
    # The same words with another status are the job's own output, and a 127 without them is a shell's.
    assert classify(1, [shim]) == "exit code 1"
    assert classify(127, ["bash: line 1: nosuch: command not found"]) == "exit code 127"
