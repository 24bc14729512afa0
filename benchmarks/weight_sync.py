"""Time the weight bridge alone: one sender and one receiver process over gloo, loopback.

    python benchmarks/weight_sync.py [--mib 64] [--tensors 64] [--buckets-mib 1 4 16 64]

A synthetic model of ``--tensors`` float32 tensors totalling ``--mib`` MiB crosses
:class:`rlcore.workers.weight_bridge.WeightBridge` once per bucket size (after one warm-up
sync); prints seconds per sync and MiB/s as the receiver saw them. Wall clock on whatever
else the machine runs: compare rows of one run, not runs.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time


def _named(mib: int, tensors: int):  # type: ignore[no-untyped-def]
    import torch

    per = max(1, mib * (1 << 20) // 4 // tensors)
    return [(f"t{i}", torch.full((per,), float(i))) for i in range(tensors)]


def _run(rank: int, port: int, mib: int, tensors: int, bucket: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from rlcore.workers.weight_bridge import WeightBridge, manifest_of

    named = _named(mib, tensors)
    bridge = WeightBridge(
        addr="127.0.0.1",
        port=port,
        rank=rank,
        world_size=2,
        backend="gloo",
        timeout_s=120,
        pools="'bench-trainer' and 'bench-rollout'",
        manifest=manifest_of(iter(named)),
        bucket_bytes=bucket,
    )
    times = []
    for version in range(3):  # one warm-up, two timed
        start = time.perf_counter()
        if rank == 0:
            bridge.send(iter(named), version)
        else:
            for _ in bridge.receive(version):
                pass
        times.append(time.perf_counter() - start)
    if rank == 1:
        out.put((len(bridge.buckets), min(times[1:])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--tensors", type=int, default=64)
    parser.add_argument("--buckets-mib", type=float, nargs="+", default=[1, 4, 16, 64])
    args = parser.parse_args()
    from rlcore.workers.worker import find_free_port

    ctx = mp.get_context("spawn")
    print(f"{args.mib} MiB in {args.tensors} float32 tensors, gloo over loopback")
    print(f"{'bucket MiB':>10} {'buckets':>8} {'s/sync':>8} {'MiB/s':>8}")
    for bucket_mib in args.buckets_mib:
        out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
        port = find_free_port()
        bucket = int(bucket_mib * (1 << 20))
        procs = [
            ctx.Process(target=_run, args=(r, port, args.mib, args.tensors, bucket, out))
            for r in (0, 1)
        ]
        for p in procs:
            p.start()
        buckets, seconds = out.get(timeout=600)
        for p in procs:
            p.join(60)
        print(f"{bucket_mib:>10g} {buckets:>8d} {seconds:>8.3f} {args.mib / seconds:>8.0f}")


if __name__ == "__main__":
    main()
