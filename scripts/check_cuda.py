"""Check autofit's CUDA backend on a real GPU, where the unit tests' fakes cannot reach.

Prints PASS, FAIL or SKIP per check and exits non-zero on any FAIL. Run it through
scripts/check_cuda.sh, or directly: python scripts/check_cuda.py [--index 0] [--limit-gib 2].
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # use this checkout even when autofit is not installed

MiB = 1024**2
GiB = 1024**3

failures: list[str] = []


def run_check(name: str, check: Callable[[], tuple[bool, str] | str]) -> None:
    """Run one check and print one line for it; an exception is a FAIL with its traceback."""
    try:
        outcome = check()
    except Exception as error:  # a crash is a failed check, and the next checks still run
        traceback.print_exc()
        outcome = (False, f"{type(error).__name__}: {error}")
    if isinstance(outcome, str):
        print(f"SKIP  {name}: {outcome}", flush=True)
        return
    passed, detail = outcome
    print(f"{'PASS' if passed else 'FAIL'}  {name}: {detail}", flush=True)
    if not passed:
        failures.append(name)


def mib(n: float) -> str:
    return f"{n / MiB:.1f} MiB"


def _offload_step(device, offload: bool):
    """One forward and backward of eight residual MLP blocks (about 300 MiB of activations each) through a Run on
    `device`, with or without activation offload: (their gradients, the peak allocated bytes)."""
    import torch

    from autofit.config import Config
    from autofit.runtime import Run

    torch.manual_seed(0)
    blocks = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                                                      torch.nn.Linear(4096, 1024)) for _ in range(8)]).to(device)
    x = torch.randn(8192, 1024, device=device)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    run = Run(Config(batch_size=8192, offload_activations=offload), device)
    with run.control.active():
        run.checkpoint(blocks)
        h = x
        for block in blocks:
            h = block(h) + h
        h.square().mean().backward()
    torch.cuda.synchronize(device)
    return [p.grad.clone() for p in blocks.parameters()], torch.cuda.max_memory_allocated(device)


def check_offload_gradients(device) -> tuple[bool, str]:
    """The offload's copies are exact and its streams ordered: the plain run's gradients, at a lower peak."""
    plain, plain_peak = _offload_step(device, False)
    offloaded, peak = _offload_step(device, True)
    worst = max(float((a - b).abs().max()) for a, b in zip(plain, offloaded, strict=True))
    ok = worst == 0.0 and peak < 0.6 * plain_peak
    return ok, f"largest gradient difference {worst:g} (want 0); peak {mib(plain_peak)} -> {mib(peak)} (want < 60%)"


def check_offload_pinned_released(backend) -> tuple[bool, str] | str:
    """After an offloaded step and `release()`, torch's host allocator holds no pinned memory."""
    import torch

    if not hasattr(torch.cuda, "host_memory_stats"):
        return f"torch {torch.__version__} has no torch.cuda.host_memory_stats"
    _offload_step(backend.torch_device(), True)
    held = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)
    backend.release()
    after = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)
    return held > 0 and after == 0, f"pinned host memory {mib(held)} after the step, {mib(after)} after release"


def check_expandable_segments() -> tuple[bool, str]:
    """A normal run's process with no allocator settings of the user's allocates expandable segments; with the
    user's own (expandable_segments:False) it does not."""
    import subprocess

    code = ("from autofit.devices import apply_allocator_settings; apply_allocator_settings(None, 'cuda'); "
            "import torch; x = torch.empty(2**26, device='cuda'); "
            "print(any(s.get('is_expandable') for s in torch.cuda.memory._snapshot()['segments']))")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    default = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    own = subprocess.run([sys.executable, "-c", code], env={**env, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"},
                         capture_output=True, text=True, timeout=120)
    said = (default.stdout.strip(), own.stdout.strip())
    return said == ("True", "False"), f"expandable segments: {said[0]} by default, {said[1]} under the user's own " \
                                      f"{(default.stderr + own.stderr).strip()[-200:]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=int, default=0, help="CUDA device index (default 0)")
    parser.add_argument("--limit-gib", type=float, default=2.0, help="memory limit for the OOM check (default 2)")
    args = parser.parse_args()
    os.chdir(ROOT)

    import torch

    if not torch.cuda.is_available():
        print(f"FAIL  cuda: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no usable GPU")
        return 2

    from autofit.devices._cuda import CudaBackend, cuda_devices
    from autofit.errors import UsageError

    backend = CudaBackend(args.index)
    device = backend.torch_device()
    oom_error = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, device {device}")

    def check_listing():
        listed = cuda_devices()
        names = [d.name for d in listed]
        torch_names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        return names == torch_names, f"NVML lists {names}, torch sees {torch_names}"

    def check_info():
        info = backend.info()
        print(f"      {info.to_dict()}")
        ok = bool(info.name) and info.total_bytes > 0 and info.free_bytes is not None
        ok = ok and 0 <= info.free_bytes <= info.total_bytes
        return ok, f"{info.name}, {mib(info.total_bytes)} total, {mib(info.free_bytes or 0)} free"

    def check_precisions():
        try:
            from autofit.runtime import precision_context
        except ImportError:
            precision_context = None
        expected = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
        supported = backend.supported_precisions()
        details, ok = [], supported[:1] == ("fp32",) and "fp16" in supported
        for name in supported:
            a = torch.randn(256, 256, device=device)
            b = torch.randn(256, 256, device=device)
            if precision_context is not None:
                context = precision_context(name, device)
            elif name in ("bf16", "fp16"):
                context = torch.autocast("cuda", dtype=expected[name])
            else:
                context = torch.autocast("cuda", enabled=False)
            with context:
                c = a @ b
            backend.synchronize()
            good = c.dtype == expected[name] and bool(torch.isfinite(c).all())
            ok = ok and good
            details.append(f"{name}->{str(c.dtype).removeprefix('torch.')}{'' if good else ' (wrong)'}")
        return ok, ", ".join(details)

    def check_peak():
        backend.release()
        backend.reset_peak()
        before = backend.peak_bytes()
        size = 256 * MiB
        x = torch.ones(size, dtype=torch.uint8, device=device)
        backend.synchronize()
        grown = backend.peak_bytes() - before
        del x
        ok = 0.95 * size <= grown <= size + 64 * MiB
        return ok, f"peak grew by {mib(grown)} for a {mib(size)} tensor (overhead from {backend.overhead_source})"

    def check_release():
        backend.release()
        baseline = torch.cuda.memory_reserved(device)
        xs = [torch.ones(64 * MiB, dtype=torch.uint8, device=device) for _ in range(8)]
        held = torch.cuda.memory_reserved(device)
        del xs
        backend.release()
        after = torch.cuda.memory_reserved(device)
        ok = held - baseline >= 512 * MiB and after - baseline <= 16 * MiB
        return ok, f"reserved {mib(baseline)} -> {mib(held)} held -> {mib(after)} after release()"

    def check_limit_refused():
        used = backend.used_bytes()
        try:
            backend.apply_memory_limit(used // 2)
        except UsageError as error:
            return backend.memory_limit is None, f"refused: {error}"
        backend.apply_memory_limit(None)
        return False, f"a limit of {mib(used // 2)} below usage {mib(used)} was accepted"

    def check_oom_near_limit():
        backend.release()
        used = backend.used_bytes()
        limit = max(int(args.limit_gib * GiB), used + GiB)
        _, total = torch.cuda.mem_get_info(device)
        if limit >= total:
            return f"the limit {mib(limit)} is not below the card's {mib(total)}"
        ooms_before = backend.allocator_stats()["num_ooms"]
        backend.apply_memory_limit(limit)
        chunk = 32 * MiB
        chunks, last_used, hit = [], used, False
        try:
            for _ in range(limit // chunk + 64):
                try:
                    chunks.append(torch.empty(chunk, dtype=torch.uint8, device=device))
                except oom_error:
                    hit = True
                    break
                last_used = backend.used_bytes()
        finally:
            del chunks
            backend.apply_memory_limit(None)
            backend.release()
        if not hit:
            return False, f"no OutOfMemoryError up to {mib(last_used)} under a limit of {mib(limit)}"
        ooms = backend.allocator_stats()["num_ooms"] - ooms_before
        ok = 0.8 * limit <= last_used <= limit and ooms >= 1
        return ok, (
            f"OOM at {mib(last_used)} used = {last_used / limit:.1%} of the {mib(limit)} limit "
            f"(want 80-100%), num_ooms +{ooms}, overhead from {backend.overhead_source}"
        )

    def check_probe():
        """TODO(worker): a real probe through autofit's worker; skipped until autofit.probing._worker exists."""
        if importlib.util.find_spec("autofit.probing._worker") is None:
            return "autofit.probing._worker does not exist yet"
        import autofit.probing._worker as worker_module  # exists: an import error here is a real failure

        worker_class = getattr(worker_module, "Worker", None)
        if worker_class is None:
            return "autofit.probing._worker has no Worker yet"
        if not (ROOT / "studies" / "mlp.py").exists():
            return "studies/mlp.py does not exist yet"
        from autofit.config import Config

        with worker_class(script="studies/mlp.py", function=None, device="cuda", index=args.index, memory_limit=None) as w:
            w.start()
            result = w.probe(Config(batch_size=64), warmup=2, steps=5, timeout=120)
        status = getattr(result, "status", None)
        return status == "ok", f"status={status!r}: {result!r}"[:300]

    def check_tf32_whole_run():
        """TF32 holds for forward and backward inside precision_scope, is off for fp32, and the
        process's own setting comes back after; a script that set the new API first still works."""
        from autofit.runtime import precision_scope

        x64 = torch.randn(1024, 1024, dtype=torch.float64, device=device)
        w64 = torch.randn(1024, 1024, dtype=torch.float64, device=device)

        def errors(name):
            x = x64.float().requires_grad_()
            w = w64.float().requires_grad_()
            with precision_scope(name, device):
                y = x @ w
                y.sum().backward()  # the backward matmuls run under the same setting
            backend.synchronize()
            fwd = ((y.double() - x64 @ w64).abs().max() / (x64 @ w64).abs().max()).item()
            ref_grad = torch.ones_like(x64) @ w64.T
            bwd = ((x.grad.double() - ref_grad).abs().max() / ref_grad.abs().max()).item()
            return fwd, bwd

        matmul = torch.backends.cuda.matmul
        before = matmul.fp32_precision
        matmul.fp32_precision = "tf32"  # what a user's script may set at import
        try:
            fp32_fwd, fp32_bwd = errors("fp32")
            tf32_fwd, tf32_bwd = errors("tf32")
            restored = matmul.fp32_precision == "tf32"
        finally:
            matmul.fp32_precision = before
        ok = tf32_fwd > 10 * fp32_fwd and tf32_bwd > 10 * fp32_bwd and restored
        return ok, (f"relative error fp32 fwd {fp32_fwd:.1e} bwd {fp32_bwd:.1e}; tf32 fwd {tf32_fwd:.1e} "
                    f"bwd {tf32_bwd:.1e} (want tf32 >> fp32 both ways); user's setting restored: {restored}")

    def check_cap_at_usable():
        """The allocator is capped at the usable memory (limit less headroom), not the limit."""
        backend.release()
        used = backend.used_bytes()
        limit = max(int(args.limit_gib * GiB), used + GiB) + GiB
        usable = limit - GiB
        backend.apply_memory_limit(limit, usable)
        chunk, chunks, last_used, hit = 32 * MiB, [], used, False
        try:
            for _ in range(limit // chunk + 64):
                try:
                    chunks.append(torch.empty(chunk, dtype=torch.uint8, device=device))
                except oom_error:
                    hit = True
                    break
                last_used = backend.used_bytes()
        finally:
            del chunks
            backend.apply_memory_limit(None)
            backend.release()
        ok = hit and 0.9 * usable <= last_used <= usable
        return ok, f"OOM at {mib(last_used)} with limit {mib(limit)}, usable {mib(usable)} (want 90-100% of usable)"

    def check_retries_counted_per_probe():
        backend.release()
        backend.reset_peak()
        stats = backend.allocator_stats()
        return stats["num_ooms"] == 0 and stats["num_alloc_retries"] == 0, f"after reset_peak: {stats}"

    def check_sticky_error_replaces_worker():
        """A device-side assert breaks the CUDA context: the worker is replaced, the next probe runs."""
        import autofit.probing._worker as worker_module
        from autofit.config import Config

        with worker_module.Worker(script="tests/scripts/device_assert.py", device="cuda", index=args.index) as w:
            w.start()
            first_pid = w.pid
            bad = w.probe(Config(batch_size=8), warmup=1, steps=2, timeout=120)
            good = w.probe(Config(batch_size=1), warmup=1, steps=2, timeout=120)
        ok = bad.status == "error" and bad.restart_worker and good.status == "ok" and w.starts == 2
        return ok, (f"first probe {bad.status} ({bad.error_type}: {(bad.error_message or '')[:80]}), "
                    f"restart={bad.restart_worker}; next probe {good.status} in a new worker "
                    f"(pid {first_pid} -> {w.pid if w.pid else 'closed'}, starts={w.starts})")

    def check_min_measured_time():
        import autofit.probing._worker as worker_module
        from autofit.config import Config

        with worker_module.Worker(script="studies/mlp.py", device="cuda", index=args.index) as w:
            w.start()
            result = w.probe(Config(batch_size=64), warmup=2, steps=5, timeout=120)
        measured = (result.measured_steps or 0) * (result.step_time_median_s or 0)
        ok = result.status == "ok" and result.measured_steps > 5
        return ok, (f"{result.measured_steps} steps measured (asked 5) at {result.step_time_median_s or 0:.4f} s "
                    f"median: ~{measured:.2f} s measured, {result.samples_per_s or 0:,.0f} samples/s")

    def distributed_probe(config, **env):
        """A probe of tests/scripts/ddp_train.py as a torchrun job with one rank per visible GPU."""
        from autofit.probing import DistributedWorker

        count = torch.cuda.device_count()
        if count < 2:
            return None, f"needs 2 or more GPUs (NCCL ranks on distinct devices); this machine shows {count}"
        saved = dict(os.environ)
        os.environ.update(env)
        try:
            with DistributedWorker("tests/scripts/ddp_train.py", nproc=count, device="cuda") as w:
                w.start()
                return w.probe(config, warmup=2, steps=5, timeout=300), count
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def check_nccl_probe():
        from autofit.config import Config

        result, detail = distributed_probe(Config(batch_size=16))
        if result is None:
            return detail
        ok = result.status == "ok" and result.world_size == detail and result.measured_steps > 5
        return ok, (f"{detail} NCCL ranks: {result.status}, {result.measured_steps} steps agreed, "
                    f"{result.samples_per_s or 0:,.0f} samples/s, peak {mib(result.peak_bytes or 0)} (largest rank)")

    def check_fsdp_offload_probe():
        from autofit.config import Config

        result, detail = distributed_probe(Config(batch_size=16, sharding="fsdp-offload"), BLOCKS="1")
        if result is None:
            return detail
        return result.status == "ok", f"{detail} ranks, FSDP2 with CPU offload: {result.status} {result.error_message or ''}"[:300]

    run_check("listing (NVML order matches CUDA's)", check_listing)
    run_check("info", check_info)
    run_check("precisions run a matmul", check_precisions)
    run_check("peak grows by an allocation", check_peak)
    run_check("release returns reserved memory", check_release)
    run_check("limit below usage is refused", check_limit_refused)
    run_check("OOM near the limit", check_oom_near_limit)
    run_check("probe through the worker", check_probe)
    run_check("TF32 set for the whole run (fwd and bwd) and restored", check_tf32_whole_run)
    run_check("allocator capped at the usable memory", check_cap_at_usable)
    run_check("allocator retries and OOMs counted per probe", check_retries_counted_per_probe)
    run_check("a sticky CUDA error replaces the worker", check_sticky_error_replaces_worker)
    run_check("a fast probe measures at least its minimum time", check_min_measured_time)
    run_check("a distributed probe over every GPU (NCCL, DDP)", check_nccl_probe)
    run_check("a distributed probe with FSDP2 and CPU offload", check_fsdp_offload_probe)
    run_check("activation offload: the plain run's gradients, less memory", lambda: check_offload_gradients(device))
    run_check("activation offload: pinned memory given back", lambda: check_offload_pinned_released(backend))
    run_check("allocator: expandable segments where the user set none", check_expandable_segments)

    if failures:
        print(f"\n{len(failures)} check(s) failed: {', '.join(failures)}")
        return 1
    print("\nAll checks passed.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
