"""Submit this directory's training script with Frenzy's Python SDK, follow it, print its output.

Run it from your project's directory with a stack up (`frenzy up` in another terminal: fake GPUs
on this machine, or a real cluster your credentials point at):

    cd my-project            # holds train.py; nothing of it needs to exist on the nodes
    python /path/to/frenzy/examples/sdk_submit.py train.py

The directory travels with the job (what git would commit; see docs/sdk.md). Exit status 0
when the job SUCCEEDED, 1 otherwise; a Frenzy error is printed with its "To fix:" hint.
"""

from __future__ import annotations

import os
import sys

from frenzy import Client, FrenzyError

MODEL, SEQ_LEN, GLOBAL_BATCH = "gpt2-355m", 1024, 32


def main(argv: list[str]) -> int:
    script = argv[1] if len(argv) > 1 else "train.py"
    python = os.environ.get("FRENZY_EXAMPLE_PYTHON", "python")  # the interpreter on the nodes
    try:
        with Client() as client:
            best = client.predict(model=MODEL, seq_len=SEQ_LEN, global_batch=GLOBAL_BATCH).plans[0]
            print(f"best plan: {best.num_gpus} x {best.gpu_type}, tp={best.layout.tp} pp={best.layout.pp} "
                  f"dp={best.layout.dp}, {best.peak_bytes_per_gpu / 2**30:.1f} GiB per GPU")
            job = client.submit(model=MODEL, seq_len=SEQ_LEN, global_batch=GLOBAL_BATCH, command=[python, script],
                                name="sdk-example")
            print(f"submitted {job.id} (code {job.code_sha256[:12]})")
            job = job.wait(timeout=600)
            for line in client.logs(job.id):
                print(f"  | {line}")
            for a in job.attempts:
                print(f"attempt {a.number}: {a.num_gpus} x {a.gpu_type}, exit code {a.exit_code}"
                      f"{f', {a.cause}' if a.cause else ''} -> {a.outcome or '?'}")
            print(f"{job.id}: {job.state}")
            return 0 if job.succeeded else 1
    except FrenzyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
