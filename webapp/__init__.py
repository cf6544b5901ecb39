"""TVM Playground: a web playground for the Apache TVM deep-learning compiler."""

from __future__ import annotations

from pathlib import Path

from flask import Flask

from webapp.config import Config

ROOT = Path(__file__).resolve().parent.parent


def create_app(config: Config | None = None) -> Flask:
    from webapp.jobs.queue import JobQueue
    from webapp.jobs.sandbox import check_bubblewrap
    from webapp.jobs.store import JobStore
    from webapp.web import api, pages

    config = config or Config.from_env()
    if not config.unsandboxed:
        check_bubblewrap()  # refuse to start rather than run models unsandboxed by accident
    app = Flask(__name__, template_folder=str(ROOT / "templates"), static_folder=str(ROOT / "static"))
    app.config["MAX_CONTENT_LENGTH"] = (config.max_upload_mb + 1) << 20
    app.extensions["playground"] = {
        "config": config,
        "store": JobStore(config.data_dir),
        "queue": JobQueue(config),
    }
    app.register_blueprint(pages.bp)
    app.register_blueprint(api.bp)
    return app
