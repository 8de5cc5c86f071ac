"""A training loop that reports its MFU as ``job.mfu`` over OTLP, the training half of the OFU/MFU correlation.

The "model" is a two-layer MLP in NumPy, float64 on the CPU (so ``gpu.precision`` is ``fp64``). Each step
runs six matmuls of the same size: two forward, and for each layer the weight and the input gradients.
Every matmul costs exactly 2MNK FLOPs, so the step costs 12 x batch x dim x hidden = 6N per token with
N = 2 x dim x hidden parameters: the 6N rule of MFU holds here exactly, not approximately.

The peak is the best FLOP/s the CPU reaches on the model's own matmul shapes and a square one
(``--peak-flops`` overrides it), so the MFU printed is what the elementwise work, the Python overhead and
the memory traffic leave of the matmul peak.

    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 python examples/train_with_mfu.py --steps 5

sends ``job.mfu`` to whatever listens there (``otel-ofu collector --listen 127.0.0.1:4317``, or any
OpenTelemetry Collector); the standard ``OTEL_EXPORTER_OTLP_*`` variables apply. Each step also prints a
line in the usual log format (``... | MFU 41.2% | ...``), which ``otel-ofu mfu-from-log`` can follow instead.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

import attrs
import numpy as np
import numpy.typing as npt

from otel_ofu import names
from otel_ofu.mfu import InvalidMfu, MfuReporter

Matrix = npt.NDArray[np.float64]


def matmul_flops(m: int, n: int, k: int) -> int:
    """An (m x k) @ (k x n) product: m x n dot products of length k, a multiply and an add each."""
    return 2 * m * n * k


@attrs.frozen
class Shape:
    batch: int  # rows per step: the "tokens"
    dim: int
    hidden: int

    @property
    def n_params(self) -> int:
        return 2 * self.dim * self.hidden

    @property
    def step_flops(self) -> int:
        """The six matmuls of ``train_step``, counted one by one."""
        b, d, h = self.batch, self.dim, self.hidden
        forward = matmul_flops(b, h, d) + matmul_flops(b, d, h)
        weight_grads = matmul_flops(h, d, b) + matmul_flops(d, h, b)
        input_grads = matmul_flops(b, h, d) + matmul_flops(b, d, h)
        return forward + weight_grads + input_grads


@attrs.define
class Mlp:
    w1: Matrix
    w2: Matrix

    def train_step(self, x: Matrix, y: Matrix, learning_rate: float) -> float:
        """One SGD step on 0.5 x mean squared error; returns the loss."""
        h = x @ self.w1
        a = np.maximum(h, 0.0)
        out = a @ self.w2
        error = (out - y) / x.shape[0]
        grad_w2 = a.T @ error
        grad_a = error @ self.w2.T
        grad_h = grad_a * (h > 0.0)
        grad_w1 = x.T @ grad_h
        # A layer below would need it: 6N counts the input gradient of every layer.
        _grad_x = grad_h @ self.w1.T
        self.w1 -= learning_rate * grad_w1
        self.w2 -= learning_rate * grad_w2
        return float(0.5 * np.sum(error * (out - y)))


def best_flops(m: int, n: int, k: int, rng: np.random.Generator, repeats: int = 5) -> float:
    a = rng.standard_normal((m, k))
    b = rng.standard_normal((k, n))
    a @ b  # warm up the BLAS threads
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return matmul_flops(m, n, k) / best


def measure_peak(shape: Shape, rng: np.random.Generator) -> float:
    """The CPU's best float64 matmul FLOP/s over the model's shapes and a square one: the "dense peak"."""
    b, d, h = shape.batch, shape.dim, shape.hidden
    size = max(d, h)
    return max(best_flops(*dims, rng) for dims in ((b, h, d), (b, d, h), (h, d, b), (size, size, size)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    parser.add_argument("--batch", type=int, default=128, help="rows (tokens) per step")
    parser.add_argument("--dim", type=int, default=256, help="model width")
    parser.add_argument("--hidden", type=int, default=1024, help="hidden width")
    parser.add_argument("--peak-flops", type=float, help="peak FLOP/s of the CPU (default: measured)")
    parser.add_argument("--job-id", default=os.environ.get(names.ENV_OFU_JOB_ID, "example-train"), help="job.id")
    parser.add_argument("--job-name", default="numpy-mlp", help="job.name")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be >= 1")

    shape = Shape(args.batch, args.dim, args.hidden)
    rng = np.random.default_rng(0)
    peak = args.peak_flops or measure_peak(shape, rng)
    flops_per_token = shape.step_flops / shape.batch
    assert flops_per_token == 6 * shape.n_params  # the 6N rule, exactly, for this model
    print(f"model: {shape.n_params:,} parameters, {flops_per_token:,.0f} FLOPs/token; peak {peak / 1e9:.1f} GFLOP/s")

    model = Mlp(
        w1=rng.standard_normal((shape.dim, shape.hidden)) / np.sqrt(shape.dim),
        w2=rng.standard_normal((shape.hidden, shape.dim)) / np.sqrt(shape.hidden),
    )
    target = rng.standard_normal((shape.dim, shape.dim)) / np.sqrt(shape.dim)
    with MfuReporter(
        args.job_id,
        job_name=args.job_name,
        flops_per_token=flops_per_token,
        num_gpus=1,
        precision="fp64",
        peak_flops_per_gpu=peak,
    ) as reporter:
        for step in range(1, args.steps + 1):
            x = rng.standard_normal((shape.batch, shape.dim))
            start = time.perf_counter()
            loss = model.train_step(x, x @ target, learning_rate=0.01)
            seconds = time.perf_counter() - start
            try:
                mfu = reporter.step(tokens=shape.batch, seconds=seconds)
            except InvalidMfu as error:  # a peak measured on a busy CPU can come out too low
                print(f"step {step} | loss {loss:.4f} | not reported: {error}", flush=True)
                continue
            print(
                f"step {step} | loss {loss:.4f} | {seconds * 1e3:.1f} ms/step | "
                f"{shape.batch / seconds / 1e3:.1f}k tok/s | MFU {mfu * 100:.1f}%",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
