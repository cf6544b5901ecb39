"""TVM Playground: a web playground for the Apache TVM deep-learning compiler."""

from __future__ import annotations

from pathlib import Path

from flask import Flask

from webapp.config import Config
from webapp.jobs.store import job_store

ROOT = Path(__file__).resolve().parent.parent


def create_app(config: Config | None = None) -> Flask:
    from webapp.jobs.queue import JobQueue
    from webapp.machine.sandbox import check_bubblewrap
    from webapp.web import api, inputs, lab, pages

    config = config or Config.from_env()
    if not config.unsandboxed:
        check_bubblewrap()  # refuse to start rather than run models unsandboxed by accident
    app = Flask(__name__, template_folder=str(ROOT / "templates"), static_folder=str(ROOT / "static"))
    app.config["MAX_CONTENT_LENGTH"] = (config.max_upload_mb + 1) << 20
    app.extensions["playground"] = {
        "config": config,
        "store": job_store(config),
        "queue": JobQueue(config),
    }
    app.register_blueprint(pages.bp)
    app.register_blueprint(api.bp)
    app.register_blueprint(inputs.bp)
    app.register_blueprint(lab.bp)
    cache_and_compress(app)
    if config.submit_rate or config.lab_rate:
        limit_submissions(app, config)
    for name in app.jinja_env.list_templates():  # compiled now, not by the first requests (which
        app.jinja_env.get_template(name)  # tripled the p99 of benchmarks/load.py --no-warm-up)
    return app


def cache_and_compress(app: Flask) -> None:
    """Responses compressed (Flask-Compress: brotli, zstd or gzip, as the browser takes them), graphs'
    SVG included; static files and the code colours addressed by their content's hash (?v=...) and
    cached for a year (webapp.web.cache)."""
    from flask import request
    from flask_compress import Compress

    from webapp.web.cache import SITE_VERSION, cache_forever, static_version

    app.config["COMPRESS_MIMETYPES"] = [
        "text/html", "text/css", "text/plain", "text/javascript", "application/javascript",
        "application/json", "image/svg+xml",
    ]  # fmt: skip
    app.config["COMPRESS_ALGORITHM"] = ["br", "zstd", "gzip"]
    Compress(app)

    @app.url_defaults
    def versioned(endpoint: str, values: dict) -> None:
        if endpoint == "static" and "v" not in values:
            values["v"] = static_version(values.get("filename", ""))
        elif endpoint == "pages.pygments_stylesheet":
            values.setdefault("v", SITE_VERSION)

    @app.after_request
    def static_forever(response):
        if request.endpoint == "static" and request.args.get("v") and response.status_code == 200:
            cache_forever(response)
        return response


def limit_submissions(app: Flask, config: Config) -> None:
    """flask-limiter on the ways to submit (a job, or an input to run on a result), per client address;
    counted in Redis when there is one (shared by every web process), else in each web process's memory."""
    from flask_limiter import Limiter
    from flask_limiter.util import get_remote_address

    storage = config.redis_url or "memory://"
    limiter = Limiter(get_remote_address, app=app, storage_uri=storage, headers_enabled=True)
    jobs = ("api.create_job", "pages.submit", "inputs.submit", "inputs.api_submit")
    # the kernel lab's builds at a rate of their own: one each pause in typing
    for rate, endpoints in ((config.submit_rate, jobs), (config.lab_rate, ("lab.api_create",))):
        for endpoint in endpoints if rate else ():
            # flask-limiter types its decorator's result as its async overload's: a Flask view all the same
            app.view_functions[endpoint] = limiter.limit(rate)(app.view_functions[endpoint])  # type: ignore[assignment]
