"""`autofit forecast` as text: one row per target GPU, the recommendation, and what the figures rest on."""

from __future__ import annotations

from autofit.config import Config
from autofit.forecast import PRICES_DATE, Forecast, TargetForecast
from autofit.units import format_size


def _config(target: TargetForecast) -> str:
    """The config to run in its label's words (by tokens `max_tokens=8192`, never its samples' cap as `b=`),
    its accumulation always said."""
    if target.config is None:
        return "does not fit"
    config = Config.from_dict(target.config)
    return config.label() + ("" if config.accumulation_steps > 1 else " acc=1")


def _count(value: float) -> str:
    if value >= 1e4:
        return f"{value / 1e3:,.0f}k"
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _amount(value: float) -> str:
    """10e9 -> '10B', 5e6 -> '5M'."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:g}{suffix}"
    return f"{value:g}"


def _row(answer: Forecast, target: TargetForecast) -> str:
    rates = answer.units_per_s(target)
    rate = "-" if rates is None else f"{_count(rates[0])} ({_count(rates[1])}-{_count(rates[2])})"
    price = "-" if target.price is None else f"{target.price.low:.2f}-{target.price.typical:.2f}"
    cost = answer.cost(target, answer.unit[1])
    dollars = "-" if cost is None else f"{cost[0]:,.2f} ({cost[1]:,.2f}-{cost[2]:,.2f})"
    hours = answer.hours(target)
    time = "" if hours is None else f"  {hours[0]:,.1f} h ({hours[1]:,.1f}-{hours[2]:,.1f})"
    return (f"  {target.gpu.name:<10} {format_size(target.usable_bytes):>10}  {_config(target):<22} "
            f"{rate:<24} {price:<12} {dollars:<22}{time}")


def forecast_table(answer: Forecast) -> list[str]:
    """The forecast's header and one row per GPU: its usable memory, the config to run, the rate
    (interval), the price range used ($/GPU-hour, low and typical), the cost per billion tokens (or
    million samples) and, with a budget, the hours it takes."""
    unit, _ = answer.unit
    per = "tokens/s" if answer.tokens_per_sample else "samples/s"
    budget = f"  hours for {_amount(answer.budget)} {unit.split()[1]}" if answer.budget else ""
    return [f"  {'gpu':<10} {'usable':>10}  {'config':<22} {per + ' (interval)':<24} {'$/h':<12} "
            f"{'$ per ' + unit:<22}{budget}"] + [_row(answer, t) for t in answer.targets]


def study_forecast(stored) -> Forecast | None:
    """The default targets' forecast of a study measured on a GPU the table lists (None elsewhere: a CPU
    study has no rate to scale; `autofit forecast` still gives its memory)."""
    from autofit.forecast import DEFAULT_TARGETS, forecast, gpu_spec, spec_of_device, study_input

    measured = study_input(stored)
    best = measured.best
    if best.device_type != "cuda" or spec_of_device(best.device_name, best.device_memory) is None:
        return None
    return forecast(measured, [gpu_spec(name) for name in DEFAULT_TARGETS])


def describe_forecast(answer: Forecast) -> str:
    """The forecast table, the recommendation, the notes and the prices' date."""
    unit, _ = answer.unit
    lines = [f"forecast from {answer.source} (measured on {answer.device})", *forecast_table(answer)]
    pick = answer.recommendation()
    lines.append(f"recommendation: cheapest per {unit.split()[1].rstrip('s')}: {pick['cheapest'] or '-'}; "
                 f"fastest: {pick['fastest'] or '-'}; smallest GPU that fits: {pick['smallest'] or '-'}")
    for target in answer.targets:
        lines += [f"note: {target.gpu.name}: {note}" for note in target.notes]
        if target.price is None and target.chosen is not None:
            lines.append(f"note: {target.gpu.name}: no price in the table: give one with --price "
                         f"{target.gpu.name}=DOLLARS_PER_HOUR")
    lines += [f"note: {note}" for note in answer.notes]
    lines.append(f"prices: $/GPU-hour on demand, {PRICES_DATE} (low: the cheapest seller found; typical: the "
                 "middle of the range); costs at the typical price, the range from the low price at the fast end "
                 "to the typical at the slow end; --price GPU=$/h sets one")
    return "\n".join(lines)
