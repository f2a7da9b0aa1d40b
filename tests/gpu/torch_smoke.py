#!/usr/bin/env python3
"""PyTorch's NCCL backend running on Loom's libnccl.so.2, device tensors.

Run on a machine with a GPU and PyTorch:
    LD_PRELOAD=build/lib/libnccl.so.2 python3 tests/gpu/torch_smoke.py [--ranks 2]

LD_PRELOAD makes the dynamic loader take Loom's library for the soname
libnccl.so.2 that libtorch_cuda needs, so NVIDIA's copy is never loaded. All
ranks share GPU 0 (Loom allows that; NVIDIA's NCCL refuses duplicate GPUs).
Every collective is checked against closed-form values; one allreduce size is
timed. Exits 0 only if every check passed; prints SKIP and exits 0 when there
is no torch or no GPU.
"""
import argparse
import ctypes
import os
import sys
import time


def worker(rank, world, port, q):
    import torch
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    out = []
    try:
        # Which libnccl answers: torch may map NVIDIA's copy too (it preloads
        # its CUDA wheels by path), but symbols resolve to the preloaded
        # library first. Loom's error strings name Loom; NVIDIA's do not.
        maps = open("/proc/self/maps").read()
        libs = sorted({l.split()[-1] for l in maps.splitlines() if "libnccl" in l})
        errstr = ctypes.CDLL(None).ncclGetErrorString
        errstr.restype = ctypes.c_char_p
        answer = errstr(3).decode()  # ncclInternalError
        out.append(f"rank {rank}: libnccl mapped: {libs}; ncclGetErrorString(3) = {answer!r}")
        if os.environ.get("LD_PRELOAD", "").endswith("libnccl.so.2"):
            assert "Loom" in answer, "the preloaded libnccl.so.2 is not the one that answers"
        n = (1 << 20) + 3
        x = torch.full((n,), float(rank + 1), device=dev)
        dist.all_reduce(x)
        want = world * (world + 1) / 2
        assert torch.all(x == want).item(), f"all_reduce: got {x[:4].tolist()} want {want}"
        g = torch.empty(world * n, device=dev)
        dist.all_gather_into_tensor(g, torch.full((n,), float(rank), device=dev))
        for r in range(world):
            assert torch.all(g[r * n:(r + 1) * n] == r).item(), "all_gather block %d wrong" % r
        rs = torch.empty(n, device=dev)
        src = torch.arange(world * n, device=dev, dtype=torch.float32) % 1000
        dist.reduce_scatter_tensor(rs, src)
        exp = (torch.arange(rank * n, (rank + 1) * n, device=dev, dtype=torch.float32) % 1000) * world
        assert torch.equal(rs, exp), "reduce_scatter wrong"
        b = torch.full((n,), float(rank), device=dev)
        dist.broadcast(b, src=world - 1)
        assert torch.all(b == world - 1).item(), "broadcast wrong"
        if world >= 2:
            if rank == 0:
                dist.send(torch.arange(1000, device=dev, dtype=torch.float32), dst=1)
            elif rank == 1:
                t = torch.empty(1000, device=dev)
                dist.recv(t, src=0)
                assert torch.equal(t, torch.arange(1000, device=dev, dtype=torch.float32)), "send/recv wrong"
        # bf16 average, the common gradient case
        h = torch.full((4096,), float(rank), device=dev, dtype=torch.bfloat16)
        dist.all_reduce(h, op=dist.ReduceOp.AVG)
        assert torch.all(h.float() == (world - 1) / 2).item(), "bf16 avg wrong"
        out.append(f"rank {rank}: all_reduce, all_gather, reduce_scatter, broadcast, send/recv, bf16 avg: OK")
        # PyTorch's NCCL memory pool: its allocator calls ncclMemAlloc /
        # ncclMemFree and puts tensors in what they return, so that memory
        # must be device memory (it is in NVIDIA's NCCL, and in Loom's when a
        # CUDA runtime sees a device).
        try:
            backend = dist.distributed_c10d._get_default_group()._get_backend(dev)
            pool = torch.cuda.MemPool(backend.mem_allocator)
        except (AttributeError, RuntimeError) as e:
            out.append(f"rank {rank}: SKIP NCCL mem pool: {e!r}")
        else:
            with torch.cuda.use_mem_pool(pool):
                m = torch.full((n,), float(rank + 1), device=dev)
            dist.all_reduce(m)
            assert torch.all(m == want).item(), f"all_reduce on ncclMemAlloc memory: got {m[:4].tolist()}"
            del m
            torch.cuda.synchronize()
            out.append(f"rank {rank}: all_reduce on a tensor in PyTorch's NCCL mem pool (ncclMemAlloc): OK")
        for mib in (1, 16, 256):
            t = torch.ones(mib << 18, device=dev)
            for _ in range(3):
                dist.all_reduce(t)
            torch.cuda.synchronize()
            iters = 20 if mib < 256 else 5
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t)
            torch.cuda.synchronize()
            us = (time.perf_counter() - t0) / iters * 1e6
            busbw = (mib << 20) / us / 1e3 * 2 * (world - 1) / world
            out.append(f"rank {rank}: all_reduce {mib} MiB float32: {us:.0f} us, busbw {busbw:.2f} GB/s")
        q.put((rank, True, out))
    except Exception as e:  # report, do not hang the parent
        q.put((rank, False, out + [f"rank {rank}: FAILED: {e!r}"]))
    finally:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--port", type=int, default=29511)
    a = ap.parse_args()
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError:
        print("SKIP: no torch")
        return 0
    if not torch.cuda.is_available():
        print("SKIP: torch sees no GPU")
        return 0
    print(f"torch {torch.__version__}, cuda {torch.version.cuda}, nccl (as torch was built) "
          f"{torch.cuda.nccl.version()}, LD_PRELOAD={os.environ.get('LD_PRELOAD', '')}")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, a.ranks, a.port, q)) for r in range(a.ranks)]
    for p in procs:
        p.start()
    ok = True
    for _ in procs:
        rank, good, lines = q.get(timeout=600)
        ok &= good
        print("\n".join(lines))
    for p in procs:
        p.join(60)
        ok &= p.exitcode == 0
    print("torch_smoke:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
