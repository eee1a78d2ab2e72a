"""The worker's side: keeps torch and the user's module loaded, runs one probe per request.

Started by `autofit.probing._worker.Worker` as `python -m autofit.probing._worker_process FD`; FD is its
end of the channel to the supervisor (autofit.probing._wire). The user's prints go to the log file
named in each request, never into the channel.

On CPU every probe runs in a fresh child forked from this warm process (torch and the user's module
already imported): the child starts from the same memory state as the user's own run, with glibc's
allocator untuned and as the import left it, so its speed and its peak are the real run's, and all of its
memory goes back when it exits. (glibc raises its mmap threshold to the largest mmapped block freed so far,
and how often each step faults pages in follows it: what the normal run does before its steps, a probe does
too, such as a Lightning Trainer's sanity check.) A long-lived process cannot promise either: glibc's heap
keeps the history of earlier probes (a fixed mmap threshold made memory return but cost ~30% on allocation-heavy
steps). The warm process runs with one intra-op thread until it forks, because GNU OpenMP hangs in a
child forked from a process whose thread team exists; the child sets the thread count back (the user's,
or the count the script set itself at import, watched there: `threads_the_script_sets`).
On CUDA the probe runs in this process (a CUDA context cannot be forked) and the caching allocator
is emptied between probes; `--probe-process persistent` walks that path on the CPU. There, before
every probe, the process is put back as it was once the script loaded (`_isolation.Pristine`), so a
probe starts where a forked one would.
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from autofit.probing._bootstrap import Loaded, bootstrap, die_with_parent, prepare_process, redirect_output, serve
from autofit.probing._script import calls_start
from autofit.probing._sources import local_modules
from autofit.probing._wire import Channel, LoadRequest, ProbeRequest, internal_failure, ok_reply, result_reply


class _Session:
    def __init__(self) -> None:
        self.loaded: Loaded | None = None
        self.fork_probes = False
        self.threads = 1
        self.pristine: Any = None  # persistent probes: the process as the script loaded it
        self.ranks: Any = None  # a rank of a kept group (autofit.probing._rank_server); None: a lone worker
        self.child: int | None = None  # the process running the current probe, where it was forked

    def load(self, message: dict) -> dict:
        started = time.perf_counter()
        import torch

        request = LoadRequest.from_wire(message["request"])
        self.fork_probes = request.device == "cpu" and request.probe_process == "fork"
        whole_script = request.function is None and calls_start(request.script)
        if self.fork_probes:
            self.threads = torch.get_num_threads()  # what the user's own run would get
            torch.set_num_threads(1)  # no OpenMP team in the process that forks (see the docstring)
        with threads_the_script_sets(torch) if self.fork_probes else nullcontext(lambda: None) as chosen:
            self.loaded = loaded = bootstrap(request, before_script=self._capture if whole_script else None)
        if self.fork_probes:
            self.threads = chosen() or self.threads  # the script chose its own thread count at import
            torch.set_num_threads(1)
        backend = loaded.backend
        if not self.fork_probes and not whole_script:
            self._capture(loaded.module)
        return ok_reply(
            **loaded.describe(),
            device=backend.info().to_dict(),
            torch_device=str(backend.torch_device()),
            precisions=list(backend.supported_precisions()),
            default_precisions=list(backend.default_precisions()),
            memory_limit=backend.memory_limit,
            versions={"torch": torch.__version__, "cuda": torch.version.cuda},
            load_s=time.perf_counter() - started,
            pid=os.getpid(),
        )

    def _capture(self, module: Any = None) -> None:
        """The process as a persistent probe must find it. A script that calls `autofit.start` runs from its
        top in every probe, so it is captured before the worker ran any of it (at load, up to its start
        call): what its top does (a global hook it registers, a switch it sets) then happens once a probe,
        as in its own run, not once at load and again in every probe."""
        if self.fork_probes:
            return
        from autofit.probing._isolation import Pristine

        self.pristine = Pristine.capture(module)

    def probe(self, message: dict) -> dict:
        request = ProbeRequest.from_wire(message["request"])
        if self.fork_probes:
            return self._probe_in_child(request)
        from autofit.probing._probe import read_memory_after

        self.pristine.restore()
        carried = self.pristine.carried_over()  # what earlier probes changed and could not be put back
        result = self._run_probe(request)
        if carried:
            result.notes.append(carried)
        if not result.restart_worker:
            # Put back now what the probe left (its module-level lists emptied, its hooks gone), so that the
            # memory it held comes back before the worker is measured: what stays is what cannot come back.
            self.pristine.restore()
            read_memory_after(result, self.loaded.backend)
        return result_reply(result)

    def _run_probe(self, request: ProbeRequest) -> Any:
        from autofit.probing._probe import run_probe
        from autofit.probing._progress import ProgressFile

        assert self.loaded is not None, "a probe before the function was loaded"
        # Of a rank group, rank 0 alone tells the runner how far the probe got (the ranks step together).
        tells = request.progress_path and (self.ranks is None or self.ranks.is_main)
        with ProgressFile(request.progress_path) if tells else nullcontext() as progress:
            result = run_probe(
                self.loaded.fn,
                request.config,
                self.loaded.backend,
                warmup_steps=request.warmup,
                measured_steps=request.steps,
                progress=progress,
                ranks=self.ranks,
                open_step_s=request.open_step_s,
                **({"min_measure_s": request.min_measure_s} if request.min_measure_s is not None else {}),
            )
        result.modules = local_modules(self.loaded.script)  # what it loaded, lazily too: the code it ran
        return result

    def _probe_in_child(self, request: ProbeRequest) -> dict:
        """Fork a fresh child for the probe; its result comes back through a pipe."""
        import torch

        from autofit.probing._failures import crash_result, describe_exit

        reader, writer = Channel.pipe()
        python_rng = random.getstate()  # `random` reseeds itself in a forked child: the script's seed is lost
        pid = os.fork()
        if pid == 0:  # the child: run the probe, send the result, leave without cleanup
            code = 0
            try:
                die_with_parent()
                random.setstate(python_rng)  # as the script left it at import, as in its own run
                reader.close()
                torch.set_num_threads(self.threads)
                reply = result_reply(self._run_probe(request))
            except BaseException as exc:  # noqa: BLE001 - reported to the supervisor, never raised
                reply = internal_failure(exc)
                code = 1
            try:
                sys.stdout.flush()
                sys.stderr.flush()
                writer.send(reply)
            finally:
                os._exit(code)
        writer.close()
        self.child = pid
        reply = reader.receive()
        self.child = None  # before it is reaped: its pid is never another process's while it is set
        reader.close()
        _, status = os.waitpid(pid, 0)
        backend = self.loaded.backend
        if reply is not None:
            if reply["ok"]:
                reply["result"]["memory_after_bytes"] = backend.used_bytes()  # the child's memory is gone
            return reply
        # The probe's process died before it could answer: a crash of the user's code.
        how = describe_exit(os.waitstatus_to_exitcode(status))
        return result_reply(crash_result(
            request.config, f"The probe's process died ({how}); the next probe starts in a fresh one.",
            memory_limit=backend.memory_limit, memory_after_bytes=backend.used_bytes()))


@contextmanager
def threads_the_script_sets(torch: Any) -> Iterator[Callable[[], int | None]]:
    """While the script is imported in a process forced to one thread: the count it sets itself with
    `torch.set_num_threads(n)`, as its own run would have it (None: it set none), whatever n (a script's 1 is
    its choice, not the fork's). The calls still reach torch."""
    original, calls = torch.set_num_threads, []

    def recording(count: int) -> None:
        calls.append(int(count))
        original(count)

    torch.set_num_threads = recording
    try:
        yield lambda: calls[-1] if calls else None
    finally:
        torch.set_num_threads = original


def main(argv: list[str]) -> int:
    prepare_process(follow_parent=True)  # a searcher SIGKILLed (or OOM-killed) takes its worker with it
    session = _Session()
    return serve(Channel.from_fd(int(argv[1])), {"load": session.load, "probe": session.probe},
                 before=lambda message: redirect_output(message.get("log_path")))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
