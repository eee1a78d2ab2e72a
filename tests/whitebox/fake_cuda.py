"""Fakes of torch.cuda and NVML for the CUDA backend's tests without a GPU (the NVML fake is put in place
through the backend's private loader, so these stay in the white-box tests)."""

from __future__ import annotations

from types import SimpleNamespace

GiB = 1024**3


MiB = 1024**2


class FakeNVMLError(Exception):
    pass


class FakeNVML:
    """The pynvml functions the backend uses, over a list of fake GPUs."""

    NVMLError = FakeNVMLError

    def __init__(self, gpus: list[dict], init_fails: bool = False, processes_fail: bool = False) -> None:
        self.gpus = gpus
        self.init_fails = init_fails
        self.processes_fail = processes_fail
        self.open = 0

    def nvmlInit(self) -> None:
        if self.init_fails:
            raise FakeNVMLError("Driver Not Loaded")
        self.open += 1

    def nvmlShutdown(self) -> None:
        self.open -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < len(self.gpus):
            raise FakeNVMLError("Invalid Argument")
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        for i, g in enumerate(self.gpus):
            if g.get("uuid") == uuid:
                return i
        raise FakeNVMLError("Not Found")

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self.gpus[handle]["name"]

    def nvmlDeviceGetMemoryInfo(self, handle: int):
        gpu = self.gpus[handle]
        return SimpleNamespace(total=gpu["total"], free=gpu["free"], used=gpu["total"] - gpu["free"])

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int):
        if self.processes_fail:
            raise FakeNVMLError("Not Supported")
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.gpus[handle].get("procs", [])]


def gpu(name: str = "NVIDIA A100-SXM4-80GB", total: int = 80 * GiB, free: int = 79 * GiB, procs=()) -> dict:
    return {"name": name, "total": total, "free": free, "procs": list(procs)}


class FakeCuda:
    """State behind the torch.cuda functions the backend calls."""

    def __init__(self) -> None:
        self.total = 80 * GiB
        self.free = 79 * GiB
        self.reserved = 0
        self.allocated = 0
        self.max_reserved = 0
        self.capability = (8, 0)
        self.bf16 = True
        self.fractions: list[tuple[float, object]] = []
        self.calls: list[str] = []
        self.stats: dict = {}
        self.host_stats: dict = {}
        """What torch.cuda.host_memory_stats says (the pinned host allocator's)."""
        self.allocator_backend = "native"
        #: What get_device_properties says of each CUDA index: its UUID (as torch prints it, no
        #: prefix; None: not matched through NVML) and its SMs.
        self.uuids: dict[int, str] = {}
        self.multiprocessors: dict[int, int] = {}
