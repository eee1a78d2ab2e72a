"""Reading stored studies: show, studies, export, report and load_study. They read the recorded
study of studies/gpt.py that ships in autofit/recorded/ (no search); what a recorded study lacks (the
probes' own output, an OOM probe, a study without estimates) comes from one short real search."""
from __future__ import annotations

import base64
import json
import os
import re
import struct
import subprocess
import sys
from dataclasses import replace

import optuna
import pytest
from click.testing import CliRunner

import autofit
from autofit.cli import cli
from autofit.errors import NoFeasibleConfig
from autofit.export import read_best
from autofit.search import SearchSettings, run_search
from autofit.study import bundled_storage_url, open_for_reading, trial_result
from tests.support import REPORT_SECTIONS, script

RECORDED = bundled_storage_url()
STEM, STUDY = "gpt", "gpt.train-cpu0"
BEST_FILE = os.path.join(os.path.dirname(autofit.__file__), "recorded", "gpt.train.best.json")
LIMIT = 768 * 2**20
SEARCHED = "reports"


@pytest.fixture(scope="module")
def recorded():
    """The bundled study of studies/gpt.py as recorded: read, never searched."""
    stored = autofit.load_study(STEM, RECORDED)
    return stored, stored.trials()


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """One real search of a script that prints, in its own storage, bounded by its probe count.

    It starts with one probe far too big (so the study surely holds an OOM), then the search resumes.
    """
    home = tmp_path_factory.mktemp("reports")
    storage = f"sqlite:///{home}/autofit.db"
    common = dict(script=script("fits_small_prints.py"), memory_limit=LIMIT, storage=storage, study=SEARCHED,
                  out=str(home / "best.json"), budget_s=600, confirm_factor=2, estimate=False)
    with pytest.raises(NoFeasibleConfig):
        run_search(SearchSettings(batch_range=(384, 512), trials=1, **common))
    result = run_search(SearchSettings(batch_range=(1, 512), trials=3, **common))
    study = optuna.load_study(study_name=SEARCHED, storage=storage)
    return result, study, storage, home


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def probes(trials) -> dict[int, str]:
    """Trial number -> status, for every trial that ran a probe."""
    return {t.number: t.user_attrs["status"] for t in trials if trial_result(t) is not None}


def table_rows(output: str) -> list[tuple[int, str, str, str]]:
    """(trial, phase, config, status) of each row of the `autofit show` table."""
    rows = []
    for line in output.splitlines():
        match = re.match(r"^[*! ] +(\d+)  (\w+) +(.+?) {2,}(ok|oom|error|diverged|timeout|crashed) ", line)
        if match:
            rows.append((int(match[1]), match[2], match[3].strip(), match[4]))
    return rows


def assert_one_line_error(result, code: int) -> str:
    assert result.exit_code == code, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autofit: error: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    return lines[0]


# --- the frame and the table ----------------------------------------------------------------------
def test_frame_has_one_row_per_probe_with_its_status(recorded):
    stored, trials = recorded
    frame = stored.trials_frame()
    assert dict(zip(frame["trial"], frame["status"])) == probes(trials)
    assert len(frame) == len(probes(trials)) == stored.document().study.probes


def test_show_lists_every_probe_sorted_by_throughput_then_the_winner(recorded):
    stored, trials = recorded
    best, why = stored.best(), stored.document().why
    shown = invoke("show", "--storage", RECORDED, "--study", STEM)
    assert shown.exit_code == 0, shown.stderr
    rows = table_rows(shown.stdout)
    assert {trial: status for trial, _, _, status in rows} == probes(trials)
    assert len(rows) == len(probes(trials))
    rates = {t.number: t.user_attrs["probe"]["samples_per_s"] for t in trials if trial_result(t)}
    ordered = [rates[trial] for trial, *_ in rows]
    measured = [r for r in ordered if r is not None]
    assert measured == sorted(measured, reverse=True) and ordered[:len(measured)] == measured
    assert f"best: {best.label()} " in shown.stdout
    assert f"why: {why}" in shown.stdout
    marked: dict[str, list[str]] = {}
    for line in shown.stdout.splitlines():
        for *_, config, _ in table_rows(line):
            marked.setdefault(config, []).append(line[0])
    assert marked.pop(best.label()).count("*") == 1  # the winner, once (it may have been probed again)
    assert not any("*" in marks for marks in marked.values())


def test_show_filters_and_sorts():
    trials = autofit.load_study("mlp", RECORDED).trials()  # the recorded MLP search: one probe failed
    study = ("--storage", RECORDED, "--study", "mlp")
    ok = sorted(n for n, s in probes(trials).items() if s == "ok")
    assert len(ok) < len(probes(trials))
    top = invoke("show", *study, "--status", "ok", "--sort", "trial", "--top", "3")
    assert [(trial, status) for trial, _, _, status in table_rows(top.stdout)] == [(n, "ok") for n in ok[:3]]
    assert "showing 3" in top.stdout
    explore = table_rows(invoke("show", *study, "--phase", "explore").stdout)
    expected = {t.number for t in trials if trial_result(t) and t.user_attrs["phase"] == "explore"}
    assert {row[0] for row in explore} == expected and {row[1] for row in explore} == {"explore"}
    newest_first = table_rows(invoke("show", *study, "--sort", "trial", "--reverse").stdout)
    assert [row[0] for row in newest_first] == sorted(probes(trials), reverse=True)


@pytest.mark.slow
def test_show_trial_prints_that_probes_own_output(searched):
    _, study, storage, _ = searched
    for trial in study.trials:
        probe = trial_result(trial)
        if probe is None or probe.status != "ok":
            continue
        shown = invoke("show", "--storage", storage, "--trial", str(trial.number), "--full")
        assert shown.exit_code == 0, shown.stderr
        assert f"trial {trial.number} of study {SEARCHED}" in shown.stdout
        assert f"config       {probe.config.label()}" in shown.stdout
        own = f"probe config: precision={probe.config.precision} batch_size={probe.config.batch_size}"
        assert own in shown.stdout and "step 1 loss" in shown.stdout
        assert shown.stdout.count("probe config:") == 1  # its own output, no other probe's
        last = shown.stdout.rstrip().splitlines()[-1]
        assert last.startswith("step ") and invoke("show", "--storage", storage, "--trial", str(trial.number)
                                                    ).stdout.rstrip().endswith(last)  # the tail, by default


@pytest.mark.slow
def test_show_trial_keeps_the_tail_of_long_output_and_full_shows_all(searched):
    from autofit.report import describe_trial

    _, study, storage, _ = searched
    stored = autofit.load_study(SEARCHED, storage)
    number = next(t.number for t in study.trials if t.user_attrs.get("status") == "ok")
    with open(stored.log_path(number)) as handle:
        lines = handle.read().rstrip("\n").splitlines()
    tail = describe_trial(stored, number, tail=3)
    assert f"last 3 of {len(lines)} lines; --full for all" in tail
    assert tail.splitlines()[-3:] == lines[-3:] and lines[0] not in tail
    full = invoke("show", "--storage", storage, "--trial", str(number), "--full").stdout
    assert all(line in full for line in lines)


@pytest.mark.slow
def test_show_trial_of_a_study_without_estimates_says_nothing_of_where_the_memory_goes(searched):
    _, study, storage, _ = searched
    assert autofit.load_study(SEARCHED, storage).estimates is None  # searched with --no-estimate
    assert "where the memory goes" not in invoke(
        "show", "--storage", storage, "--trial", str(study.trials[-1].number)).stdout


def test_show_trial_says_where_the_memory_goes_and_the_parts_add_up_to_the_peak():
    stored = autofit.load_study("cnn", RECORDED)  # the recorded conv net search, with its estimates
    assert stored.estimates is not None and stored.estimates.breakdowns and stored.estimates.error is None
    trial = max((t for t in stored.trials() if t.user_attrs.get("status") == "ok"),  # its largest batch
                key=lambda t: t.user_attrs["probe"]["peak_bytes"])
    probe = trial_result(trial)
    shown = invoke("show", "--storage", RECORDED, "--study", "cnn", "--trial", str(trial.number)).stdout
    assert "where the memory goes" in shown and "A activations" in shown
    bar = next(line for line in shown.splitlines() if line.strip().startswith("[")).strip()
    assert len(bar[1:bar.index("]")]) == 60 and ":" in bar and "A" in bar  # scaled to the limit
    parts = stored.where_memory_goes(probe.config, probe.peak_bytes)
    tensors = sum(v for k, v in parts.items() if k != "device")
    assert sum(parts.values()) == pytest.approx(max(probe.peak_bytes, tensors))  # the parts make the peak
    assert parts["activations"] > parts["parameters"]  # a conv net: its first stage's activations dominate


@pytest.mark.slow
def test_show_trial_of_an_oom_probe_says_so(searched):
    _, study, storage, _ = searched
    assert study.trials[0].user_attrs["status"] == "oom"
    shown = invoke("show", "--storage", storage, "--trial", "0").stdout
    assert "status       oom" in shown and "config       fp32 b=384" in shown and "hint" in shown
    row = next(line for line in invoke("show", "--storage", storage).stdout.splitlines()
               if table_rows(line) and table_rows(line)[0][0] == 0)
    assert "> 768.00 MiB" in row and "> 100%" in row  # an OOM needed more than the limit


# --- studies and export -----------------------------------------------------------------------------
def test_studies_lists_the_study_with_its_device_limit_and_best(recorded):
    stored, trials = recorded
    listed = invoke("studies", "--storage", RECORDED)
    assert listed.exit_code == 0, listed.stderr
    line = next(line for line in listed.stdout.splitlines() if line.startswith(STUDY + " "))
    assert "1.00 GiB" in line and stored.best().label() in line
    assert f" {len(probes(trials))} " in line
    assert f"{stored.document().measured.samples_per_s:,.1f}" in line


def test_export_writes_the_searchs_own_document(tmp_path):
    out = tmp_path / "exported.json"
    exported = invoke("export", "--storage", RECORDED, "--study", STEM, "--out", str(out))
    assert exported.exit_code == 0, exported.stderr
    assert read_best(str(out)).config == read_best(BEST_FILE).config
    written = json.loads(open(BEST_FILE).read())  # the file the recorded search wrote
    again = json.loads(out.read_text())
    for document in (written, again):  # when, and the storage as each was named (here: the URL read)
        document.pop("created"), document["study"].pop("storage")
    assert again == written  # same schema, same values, stopped and partial included


def test_load_study_api():
    written = read_best(BEST_FILE)
    stored = autofit.load_study(STEM, storage=RECORDED)
    assert stored.best() == written.config
    assert stored.document().config == written.config
    assert stored.meta.memory.limit_bytes == written.memory.limit_bytes == 2**30 and stored.name == STUDY


def test_import_autofit_stays_light():
    code = "import sys, autofit; print(sorted(m for m in ('torch', 'optuna', 'pandas', 'matplotlib') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- the report -------------------------------------------------------------------------------------
def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_report_is_one_self_contained_page_with_a_plot_per_question(recorded, tmp_path):
    stored, trials = recorded
    out, pngs = tmp_path / "report.html", tmp_path / "png"
    made = invoke("report", "--storage", RECORDED, "--study", STEM, "--out", str(out), "--png", str(pngs))
    assert made.exit_code == 0, made.stderr
    page = out.read_text()
    images = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert [alt for alt, _ in images] == [title for _, title in REPORT_SECTIONS]
    assert page.count("<img") == len(REPORT_SECTIONS) == 5
    for _, title in REPORT_SECTIONS:
        assert f">{title}</h2>" in page
    assert f"<b>Winner: {stored.best().label()}</b>" in page
    assert not re.search(r'(src|href)="(?!data:)', page) and "<script" not in page  # nothing external
    embedded = {}
    for (alt, data), (stem, _) in zip(images, REPORT_SECTIONS):
        raw = base64.b64decode(data)
        embedded[stem] = raw
        width, height = png_size(raw)
        assert 600 <= width <= 2000 and 300 <= height <= 1500, (alt, width, height)
    assert sorted(os.listdir(pngs)) == sorted(f"{stem}.png" for stem in embedded)
    import matplotlib.image

    for stem, raw in embedded.items():
        assert (pngs / f"{stem}.png").read_bytes() == raw
        pixels = matplotlib.image.imread(str(pngs / f"{stem}.png"))
        assert pixels.shape[:2] == png_size(raw)[::-1] and pixels.std() > 0.05  # decodes, not blank
    # every probe is in the page's table
    assert len(re.findall(r"<tr(?: class=\"\w+\")?><td>\d+</td><td class=\"l\">(?:explore|recheck|remeasure|confirm)", page)) \
        == len(probes(trials))


def test_plots_draw_the_studys_data(recorded):
    from autofit.report import study_figures

    stored, _ = recorded
    figures = study_figures(stored)
    assert list(figures) == [stem for stem, _ in REPORT_SECTIONS]
    frame = stored.trials_frame()
    # throughput: a legend entry per strategy that ran
    legend = [t.get_text() for t in figures["throughput"].axes[0].get_legend().get_texts()]
    ran = {p + (f" ckpt={k}" if k else "") for p, k in
           zip(frame.loc[frame.status == "ok", "precision"], frame.loc[frame.status == "ok", "checkpoint_segments"])}
    assert ran <= set(legend)
    # memory: the limit and the usable line, in MiB, and a model line per fitted strategy
    memory = figures["memory"].axes[0]
    flat = {round(float(line.get_ydata()[0]), 1) for line in memory.get_lines()
            if len(line.get_ydata()) == 2 and line.get_ydata()[0] == line.get_ydata()[1]}
    assert {round(stored.meta.memory.limit_bytes / 2**20, 1), round(stored.memory.usable_bytes / 2**20, 1)} <= flat
    assert sum(line.get_linestyle() == "--" and len(line.get_xdata()) > 2 for line in memory.get_lines()) \
        == len(stored.memory_models()) >= 1
    # progress ends at least at the winner's throughput (near-ties go to the lower peak, so the winner
    # need not be the fastest single probe); the ranking's top bar (drawn last) is the winner
    winner = stored.document().measured.samples_per_s
    assert stored.progress()["best_rate"].iloc[-1] >= winner * (1 - 1e-9)
    bars = figures["ranking"].axes[0].patches
    assert bars[-1].get_width() == pytest.approx(winner)


# --- which storage and study ------------------------------------------------------------------------
def test_without_storage_falls_back_to_the_recorded_studies_and_says_so(recorded, tmp_path, monkeypatch):
    _, trials = recorded
    monkeypatch.chdir(tmp_path)  # no studies/autofit.db here
    shown = invoke("show", "--study", STEM)
    assert shown.exit_code == 0, shown.stderr
    assert f"reading the recorded study {STUDY}" in shown.stderr and "does not exist" in shown.stderr
    assert len(table_rows(shown.stdout)) == len(probes(trials))
    listed = invoke("studies")
    assert "listing the recorded studies" in listed.stderr and STUDY in listed.stdout


def test_default_storage_with_several_studies_needs_study(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.makedirs("studies")
    default = f"sqlite:///{tmp_path}/studies/autofit.db"
    named = STUDY  # as the search names it by default
    optuna.copy_study(from_study_name=STUDY, from_storage=open_for_reading(RECORDED), to_storage=default,
                      to_study_name=named)
    optuna.create_study(study_name="other", storage=default)
    message = assert_one_line_error(invoke("show"), 2)
    assert "--study must name one of the 2 studies" in message and "other" in message and named in message
    chosen = invoke("show", "--study", STEM)  # the script's stem is enough
    assert chosen.exit_code == 0 and not chosen.stderr  # found in the default storage: no note
    assert f"study {named} ({default})" in chosen.stdout
    assert "other" in invoke("studies").stdout


@pytest.mark.parametrize("args, code, says", [
    (["show", "--study", "nope"], 2, "The study must be one of those in"),
    (["report", "--study", "nope"], 2, "The study must be one of those in"),
    (["export", "--study", "nope"], 2, "The study must be one of those in"),
    (["show", "--study", STEM, "--trial", "999"], 2, "The trial must be one of the study's probes"),
    (["show", "--study", STEM, "--sort", "bogus"], 2, "--sort must be one of throughput"),
])
def test_bad_input_is_one_line(args, code, says):
    assert says in assert_one_line_error(invoke(*args, "--storage", RECORDED), code)


def test_missing_storage_is_one_line(tmp_path):
    message = assert_one_line_error(invoke("studies", "--storage", f"sqlite:///{tmp_path}/missing.db"), 1)
    assert "must exist" in message
    assert not (tmp_path / "missing.db").exists()  # reading never creates a storage


def _as_if_on_an_h100(monkeypatch) -> autofit.StoredStudy:
    """The recorded study, its document saying it was measured on an H100 (its probes' peaks as they are)."""
    stored = autofit.load_study(STEM, RECORDED)
    document = stored.document()
    on_gpu = replace(document, device={"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "total_bytes": 85520809984},
                     measured=replace(document.measured, flops_per_sample=57671680.0))
    monkeypatch.setattr(stored, "document", lambda: on_gpu)
    return stored


def test_show_and_the_report_forecast_a_gpu_study_for_other_gpus_and_not_a_cpu_one(monkeypatch, recorded):
    from autofit.report import describe_study, render_report

    frame = recorded[0].trials_frame()
    assert "forecast for other GPUs" not in describe_study(recorded[0], frame, frame)
    stored = _as_if_on_an_h100(monkeypatch)
    shown = describe_study(stored, frame, frame)
    assert "forecast for other GPUs" in shown and "autofit forecast gpt.train-cpu0" in shown
    assert all(gpu in shown for gpu in ("H100", "H200", "A100-80GB", "L4", "B200"))
    page = render_report(stored, {stem: b"png" for stem, _ in REPORT_SECTIONS})
    assert "<h2 id=\"forecast\">Forecast for other GPUs</h2>" in page and "B200" in page


def test_forecast_reads_a_study_by_name_with_all_its_probes():
    from autofit.forecast import forecast, forecast_input, gpu_spec

    measured = forecast_input(STEM, RECORDED)
    best, rows = measured.best, measured.rows
    assert measured.source == f"study {STUDY}" and len(rows) > len(best.runner_ups) + 1
    answer = forecast(measured, [gpu_spec("L4")])
    fits = {f.label: f for f in answer.targets[0].fits}
    bf16 = {r["batch_size"] for r in rows if r["precision"] == "bf16" and not r["checkpoint_segments"]}
    in_file = {c.batch_size for c in [best.config, *(r.config for r in best.runner_ups)] if c.precision == "bf16"}
    assert len(bf16 | in_file) > len(in_file)  # the study measured more than its file keeps
    assert fits["bf16"].memory_basis == f"the slope of {len(bf16 | in_file)} measured peaks"
    assert answer.targets[0].chosen.rate is None  # a CPU study without FLOPs: memory only, no rate to scale
    assert any("no throughput: the file has no FLOPs per sample" in note for note in answer.notes)
