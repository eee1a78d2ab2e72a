"""The `autofit` command line: wiring only; the work is in the library modules."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from autofit.cli._context import CliContext, CommandFailed, as_click_error, into_context
from autofit.cli._types import (
    DURATION,
    GPU_LIST,
    INT_LIST,
    INT_RANGE,
    MEMORY_SIZE,
    PRECISION_LIST,
    SIZE_LIST,
    ChoiceList,
)
from autofit.config import CONSIDERED, KNOBS
from autofit.errors import AutofitError
from autofit.probing import PROBE_PROCESSES

#: Where each command's help sends the reader on: the documentation site's CLI page.
DOCS = "Docs: docs/reference/cli.md (build: sphinx-build docs docs/_build/html)"


class _Command(click.Command):
    """A command whose help ends by naming the docs page, after its own epilog if it has one."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        formatter.write_paragraph()
        with formatter.indentation():
            formatter.write_text(DOCS)


class _Group(click.Group):
    """Turns autofit's own errors into click's exceptions: one line and an exit status, 2 for bad
    input and 1 otherwise (autofit.cli._context). Its commands' help names the docs page."""

    command_class = _Command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except AutofitError as exc:
            raise as_click_error(exc, ctx) from exc
        except KeyboardInterrupt:  # not click's "Aborted!" and exit 1: an interrupt is 130
            click.echo("autofit: interrupted (Ctrl-C)", err=True)
            raise click.exceptions.Exit(130) from None


#: `autofit probe`'s limit when --probe-timeout is not given: its start, then each stretch of its steps.
PROBE_TIMEOUT_S = 300.0
#: What --memory-limit is when not given: a search's (search.Session's device memory, or a resumed study's
#: own), and a probe's (no cap), as --help words them (tests/docs/test_help_defaults.py holds them to the code).
LIMIT_DEFAULT_SEARCH = ("a GPU's whole memory; on the CPU, the memory free when the search starts, shared among "
                        "--parallel probes; a resumed study's own")
LIMIT_DEFAULT_PROBE = "no cap: the whole device"

def _renamed(old: str, new: str, **option):
    """A flag's old name, still taken (hidden from --help): using it prints one line naming the new flag.
    The new flag's option needs `callback=_or_renamed(new)`; giving both is bad input."""
    dest = new.lstrip("-").replace("-", "_")

    def keep(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is None or value is False:
            return value
        if ctx.params.get(dest) is not None:
            raise click.UsageError(f"Give {new} only, but got both {new} and its old name {old}.", ctx)
        from autofit.options import renamed

        renamed(old, new)
        ctx.meta[f"autofit.renamed.{dest}"] = (old, value)
        return value

    return click.option(old, f"renamed_{dest}", hidden=True, expose_value=False, callback=keep, **option)


def _or_renamed(new: str):
    """The callback of a renamed flag's new name: its value, or the old name's when only that was given."""
    dest = new.lstrip("-").replace("-", "_")

    def take(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        old = ctx.meta.get(f"autofit.renamed.{dest}")
        if old is None:
            return value
        if ctx.get_parameter_source(param.name) == click.core.ParameterSource.COMMANDLINE:
            raise click.UsageError(f"Give {new} only, but got both {new} and its old name {old[0]}.", ctx)
        return old[1]

    return take


def _knob_options(f):
    """`autofit probe`'s flag per knob (autofit.knobs), in the knobs' order: one value each, the knob's
    default where not given (a flag for a bool knob that is off by default, on/off where None is a value)."""
    for knob in reversed(KNOBS):
        shown = knob.default is not None and knob.kind is not bool
        if knob.kind is bool:
            flag = f"{knob.cli_flag}/--no-{knob.cli_flag[2:]}" if knob.optional else knob.cli_flag
            kind: dict[str, Any] = {"default": knob.default, **({} if knob.optional else {"is_flag": True})}
        elif knob.kind is int:
            flag, kind = knob.cli_flag, {"type": click.IntRange(min=knob.minimum), "default": knob.default}
        else:
            flag, kind = knob.cli_flag, {"type": click.Choice(knob.choices), "default": knob.default}
        f = click.option(flag, knob.name, show_default=shown, callback=_or_renamed(knob.cli_flag), help=knob.help,
                         **kind)(f)
    return f


def _considered_options(f=None, *, ranks: bool = True):
    """A search's list of values to consider per knob that takes one (autofit.config.CONSIDERED: `--NAME a,b`,
    the knob's flag), each passed on by the knob's name; `ranks=False` leaves out those for several ranks."""
    if f is None:
        return lambda g: _considered_options(g, ranks=ranks)
    for knob in reversed(CONSIDERED):
        if ranks or not knob.ranks:
            f = click.option(knob.cli_flag, knob.name, type=ChoiceList(knob.in_words, knob.choices), default=None,
                             help=knob.consider)(f)
    return f


def _considered(values: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    """The lists of values to consider that a command's flags gave (`_considered_options`), by knob name; each
    taken out of `values`."""
    return {k.name: v for k in CONSIDERED if (v := values.pop(k.name, None)) is not None}


def _device_options(f=None, *, many: bool = False):
    """--device, --gpu (kept on the context object, which resolves them) and --memory-limit."""
    if f is None:
        return lambda g: _device_options(g, many=many)
    f = click.option("--memory-limit", type=MEMORY_SIZE, default=None,
                     help="Memory the probes may use, e.g. 2GiB, at most the device's " +
                          (f"(default: {LIMIT_DEFAULT_SEARCH}); each worker's own." if many else
                           f"(default: {LIMIT_DEFAULT_PROBE})."))(f)
    if many:
        f = click.option("--gpu", type=GPU_LIST, default=None, expose_value=False, callback=into_context("gpu"),
                         help="GPU index, or several (0,1,2,3) to probe on all at once, one worker each; "
                              "implies --device cuda.")(f)
    else:
        f = click.option("--gpu", type=click.IntRange(min=0), default=None, expose_value=False,
                         callback=into_context("gpu"), help="GPU index; implies --device cuda.")(f)
    f = click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None, expose_value=False,
                     callback=into_context("device_type"),
                     help="Where probes run (default: $AUTOFIT_DEVICE where set, else the first visible GPU (cuda with --gpu), else cpu: where a normal run trains).")(f)
    return f


def _storage_option(help: str):
    return click.option("--storage", default=None, expose_value=False, callback=into_context("storage_url"),
                        help=help)


def _nproc_option(f):
    return click.option("--nproc-per-node", type=click.IntRange(min=1), default=1, show_default=True,
                        help="Run each probe as a torchrun job of this many ranks (data parallel through "
                             "run.distribute); the micro-batch is per rank.")(f)


def _nodes_options(f):
    f = click.option("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                     help="With --nnodes: torchrun's c10d rendezvous (node 0's address, a free port), the same "
                          "on every node.")(f)
    f = click.option("--node-rank", type=click.IntRange(min=0), default=0, show_default=True,
                     help="This machine's place: node 0 leads, the others run their share of its probes.")(f)
    return click.option("--nnodes", type=click.IntRange(min=1), default=1, show_default=True,
                        help="Machines each probe spans: run the same command on each, with its own "
                             "--node-rank.")(f)


@click.group(cls=_Group, epilog=DOCS)
@click.version_option(package_name="autofit")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Find the fastest training configuration that fits your accelerator's memory.

    The guide, the reference and the benchmarks are in docs/ (start at docs/index.md).
    """
    ctx.ensure_object(CliContext)


@cli.command()
@click.argument("target")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@_knob_options
@_renamed("--checkpoint", "--checkpoint-segments", type=click.IntRange(min=0), default=None)
@_device_options
@_nproc_option
@_nodes_options
@_storage_option("With --nnodes: an Optuna storage every node reaches (default: sqlite:///studies/autofit.db).")
@click.option("--steps", type=click.IntRange(min=1), default=5, show_default=True,
              help="Micro-batches to measure at least (a step runs 4 at most; a longer accumulation is priced "
                   "from them).")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True, help="Warm-up steps, not measured.")
@click.option("--probe-timeout", type=DURATION, default=None, callback=_or_renamed("--probe-timeout"),
              help="Kill the probe when its start (until its first micro-batch ends), or then a stretch of its "
                   "steps, goes this long without progress (default: 5m).")
@_renamed("--timeout", "--probe-timeout", type=DURATION, default=None)
@click.option("--probe-process", type=click.Choice(PROBE_PROCESSES), default=None,
              help="How probes run: fork (each in a fresh child of a warm process: the CPU's default) or "
                   "persistent (one after another in one process, as CUDA must run them).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
def probe(ctx: click.Context, target: str, script_args: tuple[str, ...], memory_limit: int | None,
          nproc_per_node: int, nnodes: int, node_rank: int, rdzv_endpoint: str | None, steps: int, warmup: int,
          probe_timeout: float | None, probe_process: str | None, as_json: bool, **knobs: Any) -> None:
    """Run one probe: a few real training steps of TARGET under one config.

    TARGET is a script with one @autofit function, or SCRIPT:FUNCTION, or a script that calls
    autofit.start; SCRIPT_ARGS (after `--`) are the script's own arguments. Exit status 0 when the
    probe ran its steps, 1 when it did not (oom, error, diverged, timeout, crashed).
    """
    from autofit.config import Config
    from autofit.devices import check_memory_limit
    from autofit.probing import ProbeSettings, check_script, follow_probe, parse_target, pass_script_args, probe_once
    from autofit.report import describe_probe

    state: CliContext = ctx.obj
    script, function = parse_target(target)
    check_script(script)
    pass_script_args(script_args)
    info = state.device_info()
    check_memory_limit(memory_limit, info)
    if knobs["batch_size"] is None and knobs["max_tokens"] is None:
        raise click.UsageError("Missing option '--batch-size' (or '--max-tokens' for a function that batches "
                               "by tokens).")
    config = Config(**{**knobs, "batch_size": knobs["batch_size"] or knobs["max_tokens"]})
    settings = ProbeSettings(script=script, function=function, config=config, device=state.device,
                             index=state.index, memory_limit=memory_limit, nproc_per_node=nproc_per_node,
                             nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, warmup=warmup,
                             steps=steps, timeout=probe_timeout if probe_timeout is not None else PROBE_TIMEOUT_S, probe_process=probe_process)
    if settings.node_rank > 0:
        ctx.exit(follow_probe(settings, state.storage()))
    result = probe_once(settings, storage=state.storage)
    if as_json:
        click.echo(json.dumps({"device": info.to_dict(), "result": result.to_dict()}, indent=2))
    else:
        click.echo(describe_probe(result, header=f"probe {target} on {info.type}:{info.index} ({info.name})"))
    ctx.exit(0 if result.ok else 1)


@cli.command()
@click.argument("target")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@_device_options(many=True)
@click.option("--parallel", type=click.IntRange(min=1), default=1, show_default=True,
              callback=_or_renamed("--parallel"),
              help="CPU only: probes run at once, each in its own worker process under its own memory limit.")
@_renamed("--workers", "--parallel", type=click.IntRange(min=1), default=None)
@_nproc_option
@_nodes_options
@click.option("--budget", type=DURATION, default="20m", show_default=True,
              help="Wall-clock budget for the whole search: 20m, 1h30m, 90s.")
@click.option("--trials", type=click.IntRange(min=1), default=None,
              help="Stop exploring after this many probes; the close contenders' second probes and the final "
                   "A/B (see --confirm-factor) come after them.")
@click.option("--headroom", type=click.FloatRange(0, 1, max_open=True), default=0.1, show_default=True,
              help="Fraction of the limit kept free: feasible means peak <= limit x (1 - headroom).")
@click.option("--global-batch", type=click.IntRange(min=1), default=None,
              help="Keep micro-batch x accumulation equal to this; accumulation is derived.")
@click.option("--batch-range", type=INT_RANGE, default=None, callback=_or_renamed("--batch-range"),
              help="Micro-batches to consider, MIN:MAX (default: the decorator's batch_range).")
@_renamed("--batch-size", "--batch-range", type=INT_RANGE, default=None)
@click.option("--token-range", type=INT_RANGE, default=None,
              help="Token caps (max_tokens) to consider for a function that batches by tokens, MIN:MAX (default: "
                   "the decorator's token_range; the climb starts at the longest sample).")
@click.option("--precision", type=PRECISION_LIST, default=None,
              help="Precisions to consider, e.g. fp32,bf16 (default: those the device runs natively, its fastest "
                   "first).")
@click.option("--accumulation", type=INT_LIST, default=None,
              help="Accumulation steps to consider without --global-batch, e.g. 1,2,4.")
@_considered_options
@click.option("--study", default=None, help="Study name (default: SCRIPT.FUNCTION-DEVICE).")
@_storage_option("Optuna storage URL (default: sqlite:///studies/autofit.db).")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Where to write the best-config JSON (default: studies/SCRIPT.FUNCTION.DEVICE.best.json, "
                   "DEVICE being cpu or the GPU model).")
@click.option("--fresh", is_flag=True, help="Delete the study's earlier trials and start over.")
@click.option("--steps", type=click.IntRange(min=1), default=5, show_default=True,
              help="Micro-batches each probe measures at least (a step runs 4 at most; a longer accumulation is "
                   "priced from them).")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True, help="Warm-up steps per probe.")
@click.option("--probe-timeout", type=DURATION, default=None,
              help="Kill a probe when its start (until its first micro-batch ends: set-up, the script's own "
                   "evaluation, compilation), or then a stretch of its steps, goes this long without progress "
                   "(default: the first start gets the budget left, later ones 3x the longest seen; steps 20x "
                   "the slowest seen; 60 s at least). No probe runs past the budget.")
@click.option("--confirm-factor", type=click.IntRange(min=1), default=None,
              help="The final A/B of the close contenders measures this many probes' steps each "
                   "(default: AUTOFIT_CONFIRM_FACTOR, else 10); smaller decides sooner, on less evidence.")
@click.option("--compile/--no-compile", "compile_", default=None,
              help="Probe torch.compile as well as eager when the function offers run.compile() (default: yes).")
@click.option("--alloc-conf", default=None, metavar="SETTINGS",
              help="PYTORCH_CUDA_ALLOC_CONF for the probes (default on CUDA, unless the environment sets the allocator: "
                   "expandable_segments:True); recorded in the best config, which a normal run applies.")
@click.option("--probe-process", type=click.Choice(PROBE_PROCESSES), default=None,
              help="How probes run: fork (each in a fresh child of a warm process: the CPU's default) or "
                   "persistent (one after another in one process, as CUDA must run them).")
@click.option("--estimate/--no-estimate", default=True, show_default=True,
              help="Predict each config's memory with the memory estimator before probing (fake tensors).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines.")
@click.option("-v", "--verbose", is_flag=True, help="A line when each probe starts, and the search space.")
@click.pass_context
def search(ctx: click.Context, target: str, script_args: tuple[str, ...], parallel: int, nproc_per_node: int, nnodes: int, node_rank: int,
           rdzv_endpoint: str | None, memory_limit: int | None, budget: float, trials: int | None, headroom: float,
           global_batch: int | None, batch_range: tuple[int, int] | None, token_range: tuple[int, int] | None,
           precision, accumulation, study: str | None,
           out: str | None, fresh: bool, steps: int, warmup: int, probe_timeout: float | None,
           confirm_factor: int | None, alloc_conf: str | None, compile_: bool | None, probe_process: str | None,
           estimate: bool, as_json: bool, quiet: bool, verbose: bool, **considered: Any) -> None:
    """Search the fastest config of TARGET that fits, within a time budget, and export it.

    TARGET is a script with one @autofit function, or SCRIPT:FUNCTION, or a script that calls
    autofit.start; SCRIPT_ARGS (after `--`) are the script's own arguments in every probe, recorded
    in the study and the best-config file. Running the same command
    again resumes the study; --fresh starts over. Exit status 0 with a winner, 1 when nothing
    fits or the function fails on every probe, 2 for bad input, 130 when interrupted.
    """
    from autofit.probing import parse_target
    from autofit.report import describe_search
    from autofit.search import LiveReporter, Reporter, SearchSettings, run_search, take_ctrl_c

    state: CliContext = ctx.obj
    script, function = parse_target(target)
    settings = SearchSettings(
        script=script, function=function, device=state.device, index=state.index, memory_limit=memory_limit,
        headroom=headroom, budget_s=budget, trials=trials, global_batch=global_batch,
        batch_range=batch_range, token_range=token_range, precision=precision, accumulation=accumulation,
        consider=_considered(considered), study=study,
        storage=state.storage_url, out=out, fresh=fresh, warmup=warmup, steps=steps, probe_timeout=probe_timeout,
        gpus=state.gpus, parallel=parallel, nproc_per_node=nproc_per_node,
        nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, estimate=estimate,
        compile=compile_, alloc_conf=alloc_conf,
        probe_process=probe_process, script_args=script_args,
        **({"confirm_factor": confirm_factor} if confirm_factor is not None else {}),
    )
    take_ctrl_c()  # a search started with SIGINT ignored (a background job) still stops on Ctrl-C
    if node_rank > 0:
        from autofit.search import follow_search

        ctx.exit(follow_search(settings))
    if not (quiet or as_json) and sys.stderr.isatty():
        reporter = LiveReporter(verbose=verbose)
    else:
        reporter = Reporter(quiet=quiet or as_json, verbose=verbose)
    try:
        result = run_search(settings, reporter)
    finally:
        reporter.close()
    if as_json:
        best = result.document.to_dict() if result.document else None
        click.echo(json.dumps({"best": best, "path": result.json_path, "probes": result.probes,
                               "oom": result.ooms, "failed": result.failed, "stopped": result.stopped,
                               "partial": result.partial}, indent=2))
    else:
        click.echo(describe_search(result))
    if result.partial:
        ctx.exit(130)


@cli.command()
@click.argument("target")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--memory", "sizes", type=SIZE_LIST, default=None,
              help="GPU memory sizes to answer for, e.g. 16GiB,24GiB,40GiB,80GiB (default: this CPU's free memory).")
@click.option("--memory-limit", type=MEMORY_SIZE, default=None, help="Without --memory: the CPU's limit to answer for.")
@click.option("--headroom", type=click.FloatRange(0, 1, max_open=True), default=0.1, show_default=True,
              help="Fraction of each size kept free.")
@click.option("--global-batch", type=click.IntRange(min=1), default=None,
              help="Keep micro-batch x accumulation equal to this.")
@click.option("--batch-range", type=INT_RANGE, default=None, callback=_or_renamed("--batch-range"),
              help="Micro-batches to consider, MIN:MAX (default: the decorator's batch_range).")
@_renamed("--batch-size", "--batch-range", type=INT_RANGE, default=None)
@click.option("--token-range", type=INT_RANGE, default=None,
              help="Token caps (max_tokens) to consider for a function that batches by tokens, MIN:MAX (default: "
                   "the decorator's token_range; the caps start at the longest sample).")
@click.option("--precision", type=PRECISION_LIST, default=None, help="Precisions to consider, e.g. fp32,bf16.")
@_considered_options(ranks=False)
@click.option("--json", "as_json", is_flag=True, help="Print the predictions as JSON.")
def estimate(target: str, script_args: tuple[str, ...], sizes: tuple[int, ...] | None, memory_limit: int | None, headroom: float,
             global_batch: int | None, batch_range: tuple[int, int] | None, token_range: tuple[int, int] | None,
             precision, as_json: bool, **considered: Any) -> None:
    """Predict, before any probe, the config that fits each memory size and where its memory goes.

    TARGET's function runs two steps on fake tensors (SCRIPT_ARGS, after `--`: the script's own arguments) (no memory is allocated) in a process of its own.
    For a function that batches by tokens (run.token_batches) the answer is a token cap (max_tokens) per size,
    each cap estimated at its worst micro-batch: the data's longest samples, as many as the cap holds.
    The answers are predictions, not measurements: `autofit search` measures.
    """
    from autofit.devices import check_device, default_memory_limit
    from autofit.memory import WhatFits
    from autofit.probing import check_script, parse_target, pass_script_args
    from autofit.report import describe_fits, describe_known_parts, fits_json, known_parts_json

    script, function = parse_target(target)
    check_script(script)
    pass_script_args(script_args)
    on_gpu = sizes is not None
    if not on_gpu:
        info = check_device("cpu", 0)
        sizes = (memory_limit or default_memory_limit(info),)
    fits = WhatFits(script, function, on_gpu=on_gpu, batch_range=batch_range, global_batch=global_batch,
                    precisions=precision, consider=_considered(considered), token_range=token_range)
    try:
        if fits.unavailable:
            raise CommandFailed(f"No memory estimate of {target} is possible: {fits.unavailable}. "
                                f"Probe it instead: autofit probe {target} --batch-size 8.")
        if fits.partial is not None:
            click.echo(json.dumps(known_parts_json(fits, target), indent=2) if as_json
                       else describe_known_parts(fits, target))
            return
        predicted = fits.predict_all(list(sizes), headroom)
    finally:
        fits.close()
    if as_json:
        click.echo(json.dumps(fits_json(fits, predicted, target), indent=2))
    else:
        click.echo(describe_fits(fits, predicted, target))


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the devices as JSON.")
def devices(as_json: bool) -> None:
    """List the devices autofit can probe on, with their memory, and what the installed PyTorch can use.

    The GPUs are read through NVML (the driver's library), whatever torch was built for. Exit status 1,
    with the fix, when NVML sees a GPU that this environment's torch cannot use (a CPU-only build of torch,
    or one built for a newer CUDA than the driver runs).
    """
    from autofit.devices import TorchView, driver_cuda_version, gpu_problem, list_devices
    from autofit.units import format_size

    found = list_devices()
    view = TorchView.of()
    if as_json:
        click.echo(json.dumps([d.to_dict() for d in found], indent=2))
    else:
        for d in found:
            free = f", {format_size(d.free_bytes)} free" if d.free_bytes is not None else ""
            click.echo(f"{d.type}:{d.index}  {d.name}  {format_size(d.total_bytes)} total{free}")
        if not any(d.type == "cuda" for d in found):
            click.echo("(no NVIDIA GPU visible: NVML found none)")
        click.echo(view.describe())
    problem = gpu_problem([d for d in found if d.type == "cuda"], view, driver_cuda_version())
    if problem:
        raise CommandFailed(f"{problem}; then run `autofit devices` again.")


def main() -> None:
    cli()
