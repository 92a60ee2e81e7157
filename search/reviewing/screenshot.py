"""A study's optuna-dashboard page as a PNG, taken by headless Chromium: the picture a pull request's text shows of
the study behind its numbers (issue #43: from a study the GPU measured, never a replay).

The dashboard is served from the storage object itself (the export's, which may be several storages read into one
in memory) on a free loopback port, with fa4-tune's notes and objective name written first, as
`python -m search dashboard` does; Chromium loads the study's page and saves it. Refused, one line each: no Chromium
(`screenshot_browser`), a study of replayed trials (`screenshot_replayed`), no PNG written (`screenshot_failed`).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from fa4tune.config import ConfigError

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
# headless, no network beyond loopback, no first-run work; virtual time lets the page's scripts draw the plots
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def browser() -> str:
    """The Chromium executable, or ConfigError screenshot_browser."""
    found = next((path for path in map(shutil.which, BROWSERS) if path), None)
    if found is None:
        raise ConfigError("screenshot_browser", f"no Chromium found ({', '.join(BROWSERS)}): install Debian's chromium "
                                                "(`apt-get install chromium`) or leave the screenshots out")
    return found


def chromium_command(page: str, profile: Path, *action: str, size: tuple[int, int] = (1400, 1000),
                     virtual_time_ms: int = 20000) -> list[str]:
    """Chromium's command line for `page` (action: `--screenshot=PATH` or `--dump-dom`)."""
    return [browser(), *FLAGS, f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
            f"--virtual-time-budget={virtual_time_ms}", *action, page]


def study_screenshot(storage, study_name: str, png: Path, size: tuple[int, int] = (1400, 1000)) -> Path:
    """`png`: the dashboard page of `study_name` in `storage`, which must hold measured trials (not a replay)."""
    import optuna
    import optuna_dashboard

    from search.reviewing.dashboard import bind, name_metrics
    from search.reviewing.notes import write_notes
    from search.storing import schema

    study = optuna.load_study(study_name=study_name, storage=storage)
    evaluated = [t for t in study.trials if t.user_attrs.get(schema.DEVICE)]
    if evaluated and all("replayed" in str(t.user_attrs[schema.DEVICE]) for t in evaluated):
        raise ConfigError("screenshot_replayed", f"study {study_name!r} was replayed from a table, not measured: its "
                                                 "dashboard is no evidence for a pull request")
    browser()  # before the server starts: no browser, nothing served
    write_notes(storage)
    name_metrics(storage)
    server = bind("127.0.0.1", 0)
    server.set_app(optuna_dashboard.wsgi(storage))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    png = Path(png)
    png.unlink(missing_ok=True)
    try:
        page = f"http://127.0.0.1:{server.server_port}/dashboard/studies/{study._study_id}"
        with tempfile.TemporaryDirectory() as profile:
            argv = chromium_command(page, Path(profile), f"--screenshot={png.resolve()}", size=size)
            done = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    finally:
        server.shutdown()
        server.server_close()
    if not png.is_file() or png.read_bytes()[:8] != PNG_MAGIC:
        tail = (done.stderr.strip().splitlines() or [""])[-1]
        raise ConfigError("screenshot_failed", f"Chromium wrote no PNG of study {study_name!r} (exit {done.returncode}): {tail}")
    return png
