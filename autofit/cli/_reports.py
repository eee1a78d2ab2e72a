"""CLI commands that read stored studies and files: show, studies, export, report, forecast (wiring only)."""

from __future__ import annotations

import click

from autofit.cli._commands import cli
from autofit.cli._types import COUNT, NAME_LIST, PRICE_LIST
from autofit.probing import STATUSES

_STUDY_HELP = "Study name, or its script's stem (default: the only study in the storage)."
_STORAGE_HELP = ("Optuna storage URL (default: sqlite:///studies/autofit.db, else the recorded studies "
                 "that ship with autofit).")


def _load(study: str | None, storage: str | None):
    from autofit.findings import load_study

    stored = load_study(study, storage)
    if stored.note:
        click.echo(f"autofit: {stored.note}", err=True)
    return stored


@cli.command()
@click.option("--study", default=None, help=_STUDY_HELP)
@click.option("--storage", default=None, help=_STORAGE_HELP)
@click.option("--trial", "trial_number", type=click.IntRange(min=0), default=None,
              help="Show this one probe in full, with its captured output.")
@click.option("--full", is_flag=True, help="With --trial: all of the probe's output, not only its tail.")
@click.option("--sort", default="throughput", show_default=True,
              help="Column to sort by: throughput, trial, peak, wall, batch, status, phase, ...")
@click.option("--reverse", is_flag=True, help="Reverse the sort order.")
@click.option("--status", type=click.Choice(STATUSES), multiple=True, help="Only probes with this status (repeatable).")
@click.option("--phase", type=click.Choice(("explore", "recheck", "remeasure", "confirm")), multiple=True,
              help="Only probes of this phase (repeatable).")
@click.option("--top", type=click.IntRange(min=1), default=None, help="Only the first N rows after sorting.")
def show(study: str | None, storage: str | None, trial_number: int | None, full: bool, sort: str,
         reverse: bool, status: tuple[str, ...], phase: tuple[str, ...], top: int | None) -> None:
    """Show a study's probes as a table, then the best config and why it won.

    With --trial N: that probe's measurements, error and captured output.
    """
    from autofit.report import describe_study, describe_trial, select_probes

    stored = _load(study, storage)
    if trial_number is not None:
        click.echo(describe_trial(stored, trial_number, full=full))
        return
    frame = stored.trials_frame()
    shown = select_probes(frame, sort=sort, reverse=reverse, status=status, phase=phase, top=top,
                          ranked_by=stored.ranked_by)
    click.echo(describe_study(stored, shown, frame))


@cli.command()
@click.option("--storage", default=None, help=_STORAGE_HELP)
def studies(storage: str | None) -> None:
    """List the studies in a storage: device, memory limit, probes, best config and its throughput."""
    from autofit.findings import list_studies
    from autofit.report import studies_table
    from autofit.study import redacted

    where, rows = list_studies(storage)
    if where.note:
        click.echo(f"autofit: {where.note}", err=True)
    click.echo(f"storage {redacted(where.storage)}")
    click.echo(studies_table(rows))


@cli.command()
@click.option("--study", default=None, help=_STUDY_HELP)
@click.option("--storage", default=None, help=_STORAGE_HELP)
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Where to write the best-config JSON (default: studies/SCRIPT.FUNCTION.DEVICE.best.json).")
def export(study: str | None, storage: str | None, out: str | None) -> None:
    """Write a stored study's best config as JSON, without probing again."""
    from autofit.export import default_best_path, device_tag, write_best
    from autofit.report import rate_text

    stored = _load(study, storage)
    document = stored.document()
    device = stored.meta.device_info
    path = out or default_best_path(stored.meta.script, stored.meta.function,
                                    device=device_tag(device.get("type", "cpu"), device.get("name")))
    write_best(path, document)
    click.echo(f"best config of {stored.name} ({stored.best().label()}, "
               f"{rate_text(document.measured)}) written to {path}")


@cli.command()
@click.option("--study", default=None, help=_STUDY_HELP)
@click.option("--storage", default=None, help=_STORAGE_HELP)
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="The HTML file to write (default: studies/STUDY.report.html).")
@click.option("--png", "png_dir", type=click.Path(file_okay=False), default=None,
              help="Also write each plot as a PNG file into this folder.")
def report(study: str | None, storage: str | None, out: str | None, png_dir: str | None) -> None:
    """Write one self-contained HTML page with plots of a study: throughput, memory, progress, winner."""
    import os

    from autofit.report import write_report

    stored = _load(study, storage)
    path = out or os.path.join("studies", f"{stored.name}.report.html")
    written = write_report(stored, path, png_dir=png_dir)
    click.echo(f"report of {stored.name} written to {path}")
    for png in written:
        click.echo(f"plot written to {png}")


@cli.command()
@click.argument("file_or_study")
@click.option("--gpu", "gpus", type=NAME_LIST, default=None,
              help="Target GPUs, e.g. H100,H200,A100-80GB,L4,B200 (default: those five).")
@click.option("--price", "prices", type=PRICE_LIST, default=None,
              help="Dollars per GPU-hour over the shipped table's, e.g. H100=2.69,L4=0.6.")
@click.option("--tokens", type=COUNT, default=None, help="Tokens to train, e.g. 10B: hours and cost of them all.")
@click.option("--samples", type=COUNT, default=None, help="Samples to train, e.g. 5M (a file without tokens).")
@click.option("--tokens-per-sample", type=COUNT, default=None,
              help="The tokens a sample holds, for a file that counts samples only (nanoGPT's: its block_size): "
                   "tokens/s and --tokens then, stated as an assumption.")
@click.option("--storage", default=None, help=_STORAGE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the forecast as JSON.")
def forecast(file_or_study: str, gpus: tuple[str, ...] | None, prices: dict[str, float] | None,
             tokens: float | None, samples: float | None, tokens_per_sample: float | None, storage: str | None,
             as_json: bool) -> None:
    """Forecast a measured config on GPUs you don't have: the config to run, throughput, cost.

    FILE_OR_STUDY is a best-config file (any autofit wrote) or a study's name. For each target GPU: the
    largest micro-batch that fits under the same headroom (same global batch), samples/s and tokens/s with
    an interval, dollars per billion tokens (million samples) and, with --tokens or --samples, the hours.
    """
    import json

    from autofit.forecast import DEFAULT_TARGETS, forecast_input, gpu_spec
    from autofit.forecast import forecast as forecast_of
    from autofit.report import describe_forecast

    answer = forecast_of(forecast_input(file_or_study, storage), [gpu_spec(name) for name in gpus or DEFAULT_TARGETS],
                         prices=prices, tokens=tokens, samples=samples, tokens_per_sample=tokens_per_sample)
    click.echo(json.dumps(answer.to_dict(), indent=2, allow_nan=False) if as_json else describe_forecast(answer))
