"""What a researcher sees, in a real browser: the MLflow UI on a logged experiment, and
JupyterLab on a notebook (headless Chromium driven by playwright).

- MLflow: a tiny experiment (baseline + one budget, one repeat, four requests) goes into a
  temporary sqlite store; `mlflow server` serves it; the runs page lists the parent run and,
  expanded, its children by value label; the parent run page shows the question (the run's
  description), the verdict metrics (`verdict/<label>`, logged by
  `workbench.experiments.runner`) and the child runs by value label.
  The verdict link opens the parent's first artifact, VERDICT.md, rendered as a table.
- MLflow, a sweep: a two-point `workbench sweep` of a tiny notebook in the same store; its
  parent run page shows the description, the per-point metric and the child runs, and its
  sweep.png artifact renders.
- JupyterLab: `jupyter lab` on the repository opens `notebooks/01_quickstart.ipynb` and shows
  its parameters cell.

Screenshots (1280x800 PNG) go to $WORKBENCH_SCREENSHOT_DIR, else `.bench/screenshots/`;
`make screenshots` writes the documentation's copies into `docs/images/`.

Needs Debian's `chromium` (/usr/bin/chromium, or $WORKBENCH_CHROMIUM) and the `playwright`
package (never its own browser download); without either the module is skipped, naming what
is missing. Deselect it with `-m "not browser"`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.experiments.template_dicts import TINY_BUDGET, changed

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CHROMIUM = os.environ.get("WORKBENCH_CHROMIUM", "/usr/bin/chromium")
TIMEOUT_MS = 60_000  # one page element; the SPA renders after several API calls
START_TIMEOUT_S = 120.0  # a server's start (imports; 2 CPUs shared with other work)
VIEWPORT = {"width": 1280, "height": 800}
NOTEBOOK = "notebooks/01_quickstart.ipynb"
SETTINGS = {"@jupyterlab/docmanager-extension/plugin": {"autosave": False},
            "@jupyterlab/apputils-extension/notification": {"fetchNews": "false"}}
VERDICT_PREFIX = "verdict/"  # the parent's verdict metrics (runner._log_verdict)

TEMPLATE = changed(TINY_BUDGET, name="browser-check")


def missing() -> list[str]:
    """What the browser test needs and this machine lacks (empty: it can run)."""
    out = []
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        out.append(f"chromium at {CHROMIUM} (apt-get install chromium, or set "
                   "WORKBENCH_CHROMIUM)")
    if importlib.util.find_spec("playwright") is None:
        out.append("the playwright package (pip install -e '.[dev]')")
    return out


def screenshot_dir() -> Path:
    d = Path(os.environ.get("WORKBENCH_SCREENSHOT_DIR") or ROOT / ".bench" / "screenshots")
    d.mkdir(parents=True, exist_ok=True)
    return d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], log: Path, **kw: Any) -> subprocess.Popen[bytes]:
    """A server in its own process group (MLflow and Jupyter spawn children)."""
    with log.open("wb") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, **kw)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the whole group; SIGKILL what is left of it after 20 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        proc.poll()  # reap the leader: a zombie keeps its group alive
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path) -> float:
    """Poll url until it answers 200; the seconds it took. Fails with the log's tail."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < START_TIMEOUT_S:
        if proc.poll() is not None:
            pytest.fail(f"server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.25)
    pytest.fail(f"{url} not up after {START_TIMEOUT_S:.0f} s:\n{log.read_text()[-3000:]}")


def shot(page: Any, name: str) -> Path:
    path = screenshot_dir() / name
    page.screenshot(path=str(path))
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    lacking = missing()
    if lacking:
        pytest.skip("browser test needs " + " and ".join(lacking))
    from playwright.sync_api import sync_playwright

    args = ["--disable-dev-shm-usage"] + (["--no-sandbox"] if os.geteuid() == 0 else [])
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        yield b
        b.close()


@pytest.fixture()
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(TIMEOUT_MS)
    p = context.new_page()
    yield p
    context.close()


@pytest.fixture(scope="module")
def mlflow_ui(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The experiment logged into a fresh store, and `workbench ui`'s `mlflow ui` on it."""
    from mlflow.tracking import MlflowClient

    from workbench.experiments.runner import run_experiment
    from workbench.experiments.template import parse_template
    from workbench.tracking.ui import ui_command

    tmp = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    MlflowClient(tracking_uri=uri).search_experiments()  # creates the schema before the server
    port = free_port()
    log = tmp / "server.log"
    proc = start([*ui_command(uri, port=port), "--workers", "1"], log)  # `workbench ui`
    try:
        t0 = time.monotonic()
        result = run_experiment(parse_template(TEMPLATE), uri=uri, progress=False)
        run_s = time.monotonic() - t0
        base = f"http://127.0.0.1:{port}"
        up_s = wait_http(f"{base}/health", proc, log)
        print(f"experiment {run_s:.1f} s; mlflow ui up after {up_s:.1f} s")
        client = MlflowClient(tracking_uri=uri)
        parent = client.get_run(result.parent_run_id)
        children = client.search_runs(
            [parent.info.experiment_id],
            filter_string=f"tags.mlflow.parentRunId = '{result.parent_run_id}'")
        yield {"base": base, "uri": uri, "parent": parent, "children": children,
               "experiment_id": parent.info.experiment_id}
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def jupyter(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """`jupyter lab` on the repository, its state (settings, workspaces) in a temp folder."""
    tmp = tmp_path_factory.mktemp("jupyter")
    token = secrets.token_hex(16)
    port = free_port()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp / "config"),
           "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces")}
    # Never write the repository's notebook (autosave of a document opened as "modified"),
    # never ask about Jupyter news (a pop-up over the notebook).
    for plugin, settings in SETTINGS.items():
        path = tmp / "settings" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings))
    log = tmp / "lab.log"
    t0 = time.monotonic()
    proc = start([str(BIN / "jupyter"), "lab", "--no-browser", f"--ServerApp.token={token}",
                  "--ServerApp.ip=127.0.0.1", f"--port={port}", "--port-retries=0",
                  f"--ServerApp.root_dir={ROOT}",
                  "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                  *(["--allow-root"] if os.geteuid() == 0 else [])], log, env=env)
    try:
        base = f"http://127.0.0.1:{port}"
        up_s = wait_http(f"{base}/api/status?token={token}", proc, log)
        print(f"jupyter lab up after {up_s:.1f} s ({time.monotonic() - t0:.1f} s)")
        yield {"base": base, "token": token}
    finally:
        stop(proc)


def close_assistant(page: Any) -> None:
    """MLflow 3's "MLflow Assistant" side panel covers a third of the page: close it."""
    button = page.get_by_role("button", name="Close", exact=True)
    if button.count():
        button.first.click()


def test_mlflow_runs_page_and_parent_run(page: Any, mlflow_ui: dict[str, Any]) -> None:
    parent, children = mlflow_ui["parent"], mlflow_ui["children"]
    question = TEMPLATE["question"]
    labels = sorted(c.info.run_name for c in children)
    verdicts = sorted(k for k in parent.data.metrics if k.startswith(VERDICT_PREFIX))
    # What the runner logged (the UI below must show it).
    assert parent.data.tags.get("mlflow.note.content", "").startswith(question)
    assert labels == ["baseline (256) r1", "budget=64 r1"]
    assert verdicts == ["verdict/budget_64"]

    # The runs page (workflowType: the "Model training" view, not the GenAI default).
    exp = f"{mlflow_ui['base']}/#/experiments/{mlflow_ui['experiment_id']}"
    page.goto(f"{exp}/runs?workflowType=machine_learning")
    page.get_by_text("matching runs").first.wait_for()
    close_assistant(page)
    row = page.get_by_role("row").filter(has_text=parent.info.run_name).first
    row.wait_for()
    row.locator("[col-id*='Run Name'] button").first.click()  # expand: the child runs
    for label in labels:
        page.get_by_role("row").filter(has_text=label).first.wait_for()
    shot(page, "mlflow_runs.png")

    # The parent run page: description = the question (+ the verdict table), the verdict
    # metrics, the child runs by value label.
    page.goto(f"{exp}/runs/{parent.info.run_id}?workflowType=machine_learning")
    page.get_by_text("Child runs").first.wait_for()
    close_assistant(page)
    page.get_by_text(question, exact=True).first.wait_for()
    assert page.get_by_text("No description").count() == 0
    # the answer above the description's "Show more" fold
    verdict = page.get_by_text("Verdict: ").first
    verdict.wait_for()
    assert verdict.is_visible()
    page.get_by_text(f"Metrics ({len(parent.data.metrics)})").wait_for()
    for name in verdicts:
        page.get_by_text(name, exact=True).first.wait_for()
    for label in labels:
        page.get_by_role("link", name=label, exact=True).first.wait_for()
    shot(page, "mlflow_parent_run.png")

    # The verdict table: the parent's first artifact, opened by the link `workbench run`
    # prints (`workbench.tracking.ui.run_artifact_url`), rendered as a markdown table.
    from workbench.experiments.results import VERDICT_MD
    from workbench.tracking.ui import run_artifact_url

    page.goto(run_artifact_url(mlflow_ui["uri"], parent.info.run_id, VERDICT_MD,
                               base=mlflow_ui["base"]))
    close_assistant(page)
    page.get_by_role("columnheader", name="decision").first.wait_for()
    for label in labels:  # the table names the value ("budget=64"), the run its repeat too
        if not label.startswith("baseline"):
            page.get_by_role("cell", name=label.rsplit(" r", 1)[0], exact=True).first.wait_for()
    shot(page, "mlflow_verdict.png")


def test_mlflow_compare_links_show_the_children(page: Any, mlflow_ui: dict[str, Any]) -> None:
    """The two links `workbench run` prints (`workbench.tracking.ui.experiment_urls`): the
    runs table filtered to the parent's children, and MLflow's compare page on them."""
    from workbench.tracking.ui import experiment_urls

    parent = mlflow_ui["parent"]
    labels = sorted(c.info.run_name for c in mlflow_ui["children"])
    runs, compare = experiment_urls(mlflow_ui["uri"], parent.info.run_id,
                                    TEMPLATE["objective"]["metric"], base=mlflow_ui["base"])
    page.goto(runs)
    # Either the runs table, or (the link failing) MLflow 3's GenAI overview.
    page.get_by_text("matching runs").or_(page.get_by_text("Tokens per Trace")).first.wait_for()
    assert "/runs" in page.url, f"{runs} landed on {page.url}, not the runs table"
    page.get_by_text(f"{len(mlflow_ui['children'])} matching runs").wait_for()
    for label in labels:
        page.get_by_role("row").filter(has_text=label).first.wait_for()
    # metric columns, the objective's among them (the saved view: `tracking.runs_view`)
    objective = TEMPLATE["objective"]["metric"]
    close_assistant(page)
    page.locator(f"[role='columnheader'][col-id*='{objective}']").first.wait_for()
    shot(page, "mlflow_children_table.png")
    page.goto(compare)
    for label in labels:
        page.get_by_text(label, exact=True).first.wait_for()


def parameter_line() -> str:
    """The first line of notebooks/01_quickstart.py's parameters cell."""
    lines = (ROOT / "notebooks" / "01_quickstart.py").read_text().splitlines()
    first = lines[lines.index('# %% tags=["parameters"]') + 1]
    assert first.startswith("model = ")
    return first


def test_jupyterlab_shows_the_parameters_cell(page: Any, jupyter: dict[str, Any]) -> None:
    line = parameter_line()
    page.goto(f"{jupyter['base']}/lab/tree/{NOTEBOOK}?token={jupyter['token']}")
    # CodeMirror renders each source line as its own .cm-line element.
    page.locator(".jp-Notebook .cm-line").filter(has_text=line.split("#")[0].strip()).first\
        .wait_for()
    cell = page.locator(".jp-Notebook .jp-Cell").filter(has_text="num_prompts = 8").first
    assert cell.is_visible()
    page.get_by_text("Python 3 (ipykernel) | Idle").wait_for()  # its kernel started
    # Opening is not editing: the tab carries no "modified" dot once the kernel reported its
    # language_info (make notebooks writes this Python's; another patch release differs).
    written = json.loads((ROOT / NOTEBOOK).read_text())["metadata"]["language_info"]
    if written.get("version") == sys.version.split()[0]:
        page.wait_for_timeout(1000)
        assert page.locator(".jp-mod-dirty").count() == 0, "the notebook opened as modified"
    shot(page, "jupyterlab_quickstart.png")


@pytest.fixture(scope="module")
def mlflow_sweep(mlflow_ui: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
                 ) -> dict[str, Any]:
    """A two-point `workbench sweep` of a tiny notebook (it logs speedup_c1 per point)
    logged into the same store the UI serves."""
    from mlflow.tracking import MlflowClient

    from tests.sweeps.test_report import metrics_notebook
    from workbench.sweeps.driver import sweep

    tmp = tmp_path_factory.mktemp("sweep")
    rows = sweep(metrics_notebook(tmp / "tiny.ipynb"), "x", [1, 3], experiment="browser-sweep",
                 uri=mlflow_ui["uri"], results_dir=tmp / "results", progress=False)
    parent = MlflowClient(tracking_uri=mlflow_ui["uri"]).get_run(rows[0]["parent_run_id"])
    return {"parent": parent, "experiment_id": parent.info.experiment_id}


def test_mlflow_sweep_parent_shows_description_and_plot(
        page: Any, mlflow_ui: dict[str, Any], mlflow_sweep: dict[str, Any]) -> None:
    """A sweep's parent run page reads like an experiment's: its description (what was
    swept, the counts, the table), its per-point metric, and the sweep.png artifact the
    link `workbench sweep` prints opens next to summary.md."""
    from workbench.tracking.ui import artifact_url

    parent, exp_id = mlflow_sweep["parent"], mlflow_sweep["experiment_id"]
    run_id = parent.info.run_id
    assert parent.data.tags["mlflow.note.content"].startswith("**Sweep** of `x` over 1, 3")
    assert set(parent.data.metrics) == {"speedup_c1"}

    base = mlflow_ui["base"]
    page.goto(f"{base}/#/experiments/{exp_id}/runs/{run_id}?workflowType=machine_learning")
    page.get_by_text("Child runs").first.wait_for()
    close_assistant(page)
    assert page.get_by_text("No description").count() == 0
    page.get_by_text("Sweep", exact=True).first.wait_for()  # the description's bold lead
    page.get_by_text("2 points: 2 finished, 0 failed.").first.wait_for()
    page.get_by_text("speedup_c1", exact=True).first.wait_for()  # the per-point metric
    for label in ("x=1", "x=3"):
        page.get_by_role("link", name=label, exact=True).first.wait_for()
    shot(page, "mlflow_sweep_parent.png")

    page.goto(artifact_url(base, exp_id, run_id, "sweep.png"))
    close_assistant(page)
    page.get_by_text("summary.md").first.wait_for()  # both artifacts listed
    page.wait_for_function(  # the plot rendered (the page's icons are far smaller)
        "() => [...document.images].some(i => i.complete && i.naturalWidth >= 300)")
    shot(page, "mlflow_sweep_plot.png")
