"""`tvm-playground serve | web | worker | pool | gc | compile | tune | run | submit`: the same pipeline as
the web, from the shell; compile, tune and run stand in for TVM's removed `tvmc` verbs."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
from dataclasses import fields, replace
from pathlib import Path

from webapp.catalog import (
    CALIBRATION_MODES,
    EXAMPLES,
    QUANTIZE_MODES,
    WEIGHT_GRANULARITY,
    WEIGHT_SCALE_MODES,
)
from webapp.config import Config
from webapp.options import JobOptions, SubmitError
from webapp.result_text import benchmark_table, bisection_lines, headline_lines, lab_lines, precision_lines
from webapp.targets import TARGETS


def cmd_serve(args: argparse.Namespace) -> int:
    """gunicorn for the web app, one local worker process and the device pool, each started again
    when it exits: a worker killed mid-job costs that job one retry, never the web."""
    config = Config.from_env()
    children = [
        Supervised("web", web_command(config, args.web_workers)),
        Supervised("worker", [sys.executable, "-m", "webapp.cli", "worker", "--jobs", str(args.jobs)]),
    ]
    if args.pool:  # the device pool (tracker, emulated boards) comes up in the background
        children.append(Supervised("pool", [sys.executable, "-m", "webapp.cli", "pool"]))
    if args.example_files:
        threading.Thread(target=make_example_files, args=(config,), daemon=True).start()
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    try:
        while not stopping:
            for child in children:
                child.keep_running()
            time.sleep(0.2)
    finally:
        for child in children:
            child.stop()
    return 0


def make_example_files(config: Config) -> None:
    """Each built-in example's .onnx and .pt2, made once in the background (at a low CPU priority) when
    the server starts, so that its download, and its first job, do not wait for the export."""
    from webapp.catalog import EXAMPLES
    from webapp.jobs.worker import ensure_example_files

    for name in EXAMPLES:
        try:
            ensure_example_files(config, name, nice=10)
        except Exception as exc:  # noqa: BLE001 - made on first use instead
            print(
                f"serve: the {name} example's files were not made ({exc}); made on first use", file=sys.stderr
            )


def cmd_web(args: argparse.Namespace) -> int:
    """The web app alone (gunicorn): the workers run elsewhere, sharing the data folder, the queue
    (REDIS_URL) and the store (DATABASE_URL)."""
    command = web_command(Config.from_env(), args.web_workers)
    os.execv(command[0], command)


def web_command(config: Config, workers: int) -> list[str]:
    """gunicorn's command line for the web app, on HOST:PORT; checks first that the app starts."""
    from webapp import create_app

    create_app(config)  # fails early, with the reason, if the sandbox cannot run
    host = os.environ.get("HOST", "127.0.0.1")
    print(f"TVM Playground on http://{host}:{config.port}  (data in {config.data_dir})", flush=True)
    command = [str(Path(sys.executable).parent / "gunicorn"), "--workers", str(workers), "--threads", "4"]
    command += ["--worker-connections", "8"]
    return command + ["--bind", f"{host}:{config.port}", "--timeout", "120", "webapp:create_app()"]


class Supervised:
    """A child process of `serve`, started again when it exits: after 1 s, doubling up to 30 s
    while it keeps exiting within a minute of its start."""

    restart_at: float | None  # when to start it again, once it exited

    def __init__(self, name: str, argv: list[str]):
        self.name, self.argv, self.delay = name, argv, 0.5
        self.proc = subprocess.Popen(argv)
        self.started, self.restart_at = time.monotonic(), None

    def keep_running(self) -> None:
        now = time.monotonic()
        if self.restart_at is None and self.proc.poll() is not None:
            self.delay = min(self.delay * 2, 30.0) if now - self.started < 60 else 1.0
            print(f"serve: the {self.name} exited ({self.proc.returncode}); starting it again", flush=True)
            self.restart_at = now + self.delay
        if self.restart_at is not None and now >= self.restart_at:
            self.proc, self.started, self.restart_at = subprocess.Popen(self.argv), now, None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def cmd_worker(args: argparse.Namespace) -> int:
    config = Config.from_env()
    if not config.unsandboxed:
        from webapp.machine.sandbox import check_bubblewrap

        check_bubblewrap()
    from webapp.jobs.lab import waiting_labs
    from webapp.jobs.own_input import waiting_runs
    from webapp.jobs.queue import JobQueue
    from webapp.jobs.worker import look_after, requeue_waiting

    queue = JobQueue(config)
    requeue_waiting(config, queue.enqueue)
    for job_id, run_id in waiting_runs(config):  # own-input runs, likewise
        queue.enqueue_input(job_id, run_id)
    for lab_id in waiting_labs(config):  # and kernel lab runs
        queue.enqueue_lab(lab_id)
    look_after(config, queue.enqueue)  # dead workers here, lost machines, the retention policy
    queue.consumer(workers=args.jobs).run()
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    """The retention policy, now (the worker also runs it every hour)."""
    from webapp.jobs.storage import age_policy, collect_garbage

    overrides = {k: v for k, v in (("keep_days", args.days), ("keep_gb", args.gb)) if v is not None}
    config = Config.from_env(**overrides)
    done = collect_garbage(config)
    policy = [age_policy(config.keep_days) if config.keep_days else None]
    policy.append(f"beyond {config.keep_gb:g} GB" if config.keep_gb else None)
    print(f"retention: {' or '.join(p for p in policy if p) or 'keep everything'} (in {config.data_dir})")
    print(f"expired {len(done['expired'])} jobs' artifacts, freed {done['freed_bytes'] / 1e6:.1f} MB")
    for job_id in done["expired"]:
        print(f"  {job_id}")
    return 0


def cmd_pool(args: argparse.Namespace) -> int:
    from webapp.devices.pool import run_pool

    return run_pool(Config.from_env())


def compile_locally(
    config: Config, model_arg: str, form: dict, out: Path, tuning_records: Path | None = None
) -> dict | None:
    """Run the pipeline on one model (a file or an example name) into the folder `out`, sandboxed
    unless config.unsandboxed, with the options in `form` (the API's field names), starting from the
    tuning records in the folder `tuning_records` if given. Returns the error ({"stage", "message"})
    or None. Raises SubmitError for arguments refused before anything runs."""
    from webapp.jobs.submit import archive_kind, sniff_model_format
    from webapp.jobs.worker import data_files, prepare_job_folder, run_prepared_job

    options = JobOptions.parse({k: str(v) for k, v in form.items() if v is not None}).to_json()
    if out.exists() and any(out.iterdir()):
        raise SubmitError(f"{out} is not empty; give a new or empty folder with --out.")
    model = Path(model_arg)
    if not model.exists() and model_arg in EXAMPLES:
        options["example"] = model_arg
    elif model.is_file():
        with open(model, "rb") as f:
            kind = sniff_model_format(f.read(16), model.name)
        options["model_file"] = f"model.{kind}"
        (out / "input").mkdir(parents=True, exist_ok=True)
        data = data_files(model) if kind == "onnx" else []
        if data:  # its external data beside it: one archive, as an upload brings it
            options["model_file"] = "model.zip"
            with zipfile.ZipFile(out / "input" / "model.zip", "w") as archive:
                for path in (model, *data):
                    archive.write(path, path.name)
        else:
            shutil.copyfile(model, out / "input" / options["model_file"])
        if kind == "pt2":  # a zip: a .pt2, or an .onnx with its data files
            options["model_file"] = archive_kind(
                out / "input" / "model.pt2", model.name, config.max_unzipped_mb
            )
    else:
        raise SubmitError(f"{model_arg!r} is neither a file nor an example ({', '.join(EXAMPLES)}).")
    out.mkdir(parents=True, exist_ok=True)
    if tuning_records is not None:
        missing = [n for n in TUNING_FILES if not (tuning_records / n).is_file()]
        if missing:
            raise SubmitError(
                f"{tuning_records} has no {' or '.join(missing)} (a MetaSchedule JSON database)."
            )
        (out / "input" / "tuning").mkdir(parents=True, exist_ok=True)
        for name in TUNING_FILES:
            shutil.copyfile(tuning_records / name, out / "input" / "tuning" / name)
        options["tuning_upload"] = True
    prepare_job_folder(config, out, options)
    return run_prepared_job(config, out, options["target"])


TUNING_FILES = ("database_workload.json", "database_tuning_record.json")


def cmd_compile(args: argparse.Namespace) -> int:
    """Like `tvmc compile`: the pipeline on one model, its results in --out and, with -o, a package
    of the compiled model (webapp.exports.package) that runs with the TVM runtime alone."""
    if not args.out and not args.output:
        print("error: give --out DIR (the results) or -o model.tar (the package), or both", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="tvm-playground-") as scratch:
        out = Path(args.out or Path(scratch) / "job").resolve()
        code = run_pipeline(
            args, out, args.tune_trials, Path(args.tuning_records) if args.tuning_records else None
        )
        if code == 0 and args.output:
            from webapp.exports.package import make_package

            meta = make_package(out, Path(args.output))
            shapes = ", ".join(f"{s['name']} {s['shape']} {s['dtype']}" for s in meta["inputs"])
            print(f"Package: {args.output} (model.so, metadata.json, run.py; inputs: {shapes})")
    return code


def cmd_tune(args: argparse.Namespace) -> int:
    """Like `tvmc tune`: MetaSchedule on the model's kernels, the records written to --output (a
    JSON database that `compile --tuning-records` and a job's upload take)."""
    with tempfile.TemporaryDirectory(prefix="tvm-playground-") as scratch:
        code = run_pipeline(args, Path(scratch) / "job", args.trials, None)
        if code == 0:
            records = Path(args.output)
            records.mkdir(parents=True, exist_ok=True)
            for name in TUNING_FILES:
                shutil.copyfile(Path(scratch) / "job" / "tuning" / name, records / name)
            lines = (records / TUNING_FILES[1]).read_text().splitlines()
            print(f"Tuning records: {records} ({len(lines)} records; use them with compile --tuning-records)")
    return code


def run_pipeline(args: argparse.Namespace, out: Path, trials: int, tuning_records: Path | None) -> int:
    """The sandboxed pipeline for compile and tune, its stages and benchmark table printed."""
    from webapp.machine.sandbox import SandboxUnavailable, check_bubblewrap

    config = Config.from_env(unsandboxed=True) if args.no_sandbox else Config.from_env()
    print(f"Compiling {args.model} for {args.target} in {out} ...", flush=True)
    try:
        if not config.unsandboxed:
            check_bubblewrap()
        form = {f.name: getattr(args, f.name, None) for f in fields(JobOptions)}  # each option is a flag
        form["tune_trials"] = trials
        error = compile_locally(config, args.model, form, out, tuning_records)
    except (SubmitError, SandboxUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    progress = json.loads((out / "progress.json").read_text())
    for s in progress["stages"]:
        secs = f"{s['seconds']:.1f} s" if s.get("seconds") is not None else ""
        print(f"  {s['name']:<10} {s['status']:<8} {secs}")
        if s.get("status") == "failed" and s.get("error"):  # a step the job went on without
            print(f"             {s['error']}")
    if error:
        print(f"error: failed at the {error['stage']} stage: {error['message']}", file=sys.stderr)
        print(f"(full log: {out / 'log.txt'})", file=sys.stderr)
        return 1
    result = json.loads((out / "result.json").read_text())
    print(benchmark_table(result))
    print(headline_lines(result))
    if result.get("bisection"):
        print(bisection_lines(result))
    if search := (result.get("quantization") or {}).get("precision_search"):
        print(precision_lines(search))
    if getattr(args, "out", None):  # else a scratch folder, removed
        print(f"Result JSON: {out / 'result.json'}   compiled library: {out / 'files' / 'model.so'}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Like `tvmc run`: a package's model on --inputs (an .npz), in the sandbox unless --no-sandbox:
    the library is code compiled from a model."""
    from webapp.exports.package import unpack
    from webapp.machine.sandbox import SandboxUnavailable, check_bubblewrap, run_sandboxed

    config = Config.from_env(unsandboxed=True) if args.no_sandbox else Config.from_env()
    with tempfile.TemporaryDirectory(prefix="tvm-playground-run-") as scratch:
        folder = Path(scratch)
        try:
            if not config.unsandboxed:
                check_bubblewrap()
            unpack(Path(args.package), folder)
        except (SandboxUnavailable, OSError, KeyError, ValueError, tarfile.TarError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        command = [sys.executable, "run.py", "--package", str(folder), "--output", str(folder / "out.npz")]
        if args.inputs:
            shutil.copyfile(args.inputs, folder / "in.npz")
            command += ["--inputs", str(folder / "in.npz")]
        command += ["--print-time", "--repeat", str(args.repeat)] if args.print_time else []
        command += ["--profile"] if args.profile else []
        outcome = run_sandboxed(folder, replace(config, wall_limit_s=max(config.wall_limit_s, 600)), command)
        log = (folder / "log.txt").read_text(errors="replace")
        print(log.replace(str(folder / "out.npz"), args.output or "(not kept)").rstrip())
        if outcome.returncode != 0:
            print(f"error: {outcome.limit or 'the run failed'}", file=sys.stderr)
            return 1
        if args.output:
            shutil.copyfile(folder / "out.npz", args.output)
    return 0


def cmd_lab(args: argparse.Namespace) -> int:
    """The kernel lab from the shell: a kernel's TVMScript and schedule built in the sandbox for a target,
    printed as the lab's page shows it (webapp/jobs/lab.py); --starter prints a starter to begin from."""
    from webapp.jobs.lab import folder_view, lab_targets, run_code, starters
    from webapp.machine.sandbox import SandboxUnavailable, check_bubblewrap

    if args.starter or not args.code:
        print(starters().get(args.starter or "") or "starters: " + ", ".join(starters()), end="")
        return 0 if args.starter in starters() else 2
    if args.target not in lab_targets():
        print(f"error: the lab builds for {', '.join(lab_targets())}", file=sys.stderr)
        return 2
    config = Config.from_env(unsandboxed=True) if args.no_sandbox else Config.from_env()
    with tempfile.TemporaryDirectory(prefix="tvm-playground-lab-") as scratch:
        folder = Path(scratch) / "lab"
        (folder / "input").mkdir(parents=True)
        config = replace(config, data_dir=Path(scratch))  # the sandbox sees nothing of it but the folder
        (folder / "input" / "lab.json").write_text(
            json.dumps({"code": Path(args.code).read_text(), "target": args.target})
        )
        try:
            if not config.unsandboxed:
                check_bubblewrap()
            error = run_code(config, folder)
        except SandboxUnavailable as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        view = folder_view(folder, {"status": "failed" if error else "done", "error": error})
    print(lab_lines(view, args.show))
    return 1 if view["status"] == "failed" else 0


def cmd_submit(args: argparse.Namespace) -> int:
    """A job for a running playground (its JSON API); prints the result's link, and with --wait the
    result's state when it ends."""
    import urllib.error
    import urllib.request

    form = {f.name: getattr(args, f.name, None) for f in fields(JobOptions)}
    fields_ = {
        k: str(v).lower() if isinstance(v, bool) else str(v)
        for k, v in form.items()
        if v not in (None, False)
    }
    files = {}
    model = Path(args.model)
    if model.is_file():
        files["model"] = (model.name, model.read_bytes())
    else:
        fields_["example"] = args.model
    body, content_type = multipart(fields_, files)
    server = args.server.rstrip("/")
    request = urllib.request.Request(f"{server}/api/jobs", body, {"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            job = json.loads(resp.read())
    except urllib.error.HTTPError as e:
        print(f"error: {e.code}: {json.loads(e.read() or b'{}').get('error', e.reason)}", file=sys.stderr)
        return 2
    except (urllib.error.URLError, OSError) as e:
        print(f"error: cannot reach {server}: {e}", file=sys.stderr)
        return 2
    print(job["url"] + ("   (an identical job's result)" if job.get("reused") else ""))
    if job.get("delete_url"):
        print(f"delete link: {job['delete_url']}")
    while args.wait:
        with urllib.request.urlopen(job["api_url"], timeout=60) as resp:
            state = json.loads(resp.read())
        if state["status"] in ("done", "failed", "cancelled"):
            print(f"{state['status']}" + (f": {state['error']['message']}" if state.get("error") else ""))
            return 0 if state["status"] == "done" else 1
        time.sleep(2)
    return 0


def multipart(fields_: dict[str, str], files: dict[str, tuple[str, bytes]]) -> tuple[bytes, str]:
    boundary = f"tvm-playground-{os.urandom(8).hex()}"
    parts = []
    for name, value in fields_.items():
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        )
    for name, (filename, data) in files.items():
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
        parts.append(head.encode() + b"Content-Type: application/octet-stream\r\n\r\n" + data + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def job_arguments(p: argparse.ArgumentParser, sandbox: bool = True) -> None:
    """The model and the job's options, as compile, tune and submit take them."""
    d = JobOptions()
    p.add_argument(
        "model",
        help=f"an .onnx (its model.onnx.data beside it taken along) or .pt2 file, a .zip of an .onnx and its "
        f"external data files, or an example name ({', '.join(EXAMPLES)})",
    )
    p.add_argument("--target", default=d.target, choices=list(TARGETS))
    p.add_argument("--input-shapes", help="JSON, e.g. '{\"input\": [1, 3, 224, 224]}'")
    p.add_argument(
        "--input-values", help="JSON: inputs built with a fixed value, e.g. a sample rate '{\"sr\": 16000}'"
    )
    p.add_argument("--quantize", default=d.quantize, choices=QUANTIZE_MODES)
    p.add_argument("--calibration", default=d.calibration, choices=CALIBRATION_MODES)
    p.add_argument("--weight-scale", default=d.weight_scale, choices=WEIGHT_SCALE_MODES)
    p.add_argument("--weight-granularity", default=d.weight_granularity, choices=WEIGHT_GRANULARITY)
    p.add_argument("--global-scale", type=float, default=d.global_scale, help="for --calibration global")
    p.add_argument("--skip-first", action="store_true", help="keep the first quantizable layer in float")
    p.add_argument("--skip-last", action="store_true", help="keep the last quantizable layer in float")
    p.add_argument("--bisect", action="store_true", help="find the first pass whose outputs diverge")
    p.add_argument("--accuracy-budget", help="with --quantize int8: '30 dB' (SQNR) or '99%%' (top-1) to keep")
    p.add_argument("--layer-precision", help="with --quantize int8: JSON, layer name -> float, int8 or int4")
    if sandbox:
        p.add_argument("--no-sandbox", action="store_true", help="run without bubblewrap (development only)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tvm-playground", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="serve the web app with a local worker (PORT, PLAYGROUND_DATA)")
    p.add_argument("--web-workers", type=int, default=2)
    p.add_argument("--jobs", type=int, default=1, help="jobs its worker runs at once")
    p.add_argument(
        "--no-pool", dest="pool", action="store_false", help="no device pool (tracker, boards) with it"
    )
    p.add_argument(
        "--no-example-files", dest="example_files", action="store_false",
        help="make the examples' .onnx and .pt2 on first use, not in the background at start",
    )  # fmt: skip
    p.set_defaults(func=cmd_serve)
    p = sub.add_parser("web", help="serve the web app alone; workers run elsewhere (REDIS_URL, DATABASE_URL)")
    p.add_argument("--web-workers", type=int, default=2)
    p.set_defaults(func=cmd_web)
    p = sub.add_parser("worker", help="run queued jobs (shares the data folder, or REDIS_URL)")
    p.add_argument("--jobs", type=int, default=1, help="jobs run at once")
    p.set_defaults(func=cmd_worker)
    p = sub.add_parser("gc", help="apply the retention policy now (PLAYGROUND_KEEP_DAYS, PLAYGROUND_KEEP_GB)")
    p.add_argument("--days", type=float, help="expire finished jobs older than this (0: never)")
    p.add_argument("--gb", type=float, help="expire the oldest while the data is larger (0: no cap)")
    p.set_defaults(func=cmd_gc)
    p = sub.add_parser(
        "pool", help="the device pool: TVM RPC tracker and emulated boards (PLAYGROUND_TRACKER)"
    )
    p.set_defaults(func=cmd_pool)
    p = sub.add_parser("compile", help="compile one model, print its benchmark; -o: a package (tvmc compile)")
    job_arguments(p)
    p.add_argument("--out", help="a new folder for the result JSON and artifacts")
    p.add_argument("-o", "--output", help="write the compiled model as a package (.tar) for the TVM runtime")
    p.add_argument("--tune-trials", type=int, default=JobOptions().tune_trials, help="MetaSchedule trials")
    p.add_argument("--tuning-records", help="a folder with tuning records (tune --output) to start from")
    p.set_defaults(func=cmd_compile)
    p = sub.add_parser("tune", help="tune the model's kernels, write the records (tvmc tune)")
    job_arguments(p)
    p.add_argument("--trials", type=int, required=True, help="MetaSchedule trials")
    p.add_argument("--output", required=True, help="a folder for the records (a MetaSchedule JSON database)")
    p.set_defaults(func=cmd_tune)
    p = sub.add_parser("run", help="run a package from compile -o on inputs (tvmc run)")
    p.add_argument("package", help="a .tar written by compile -o")
    p.add_argument("--inputs", help=".npz of the inputs by name (missing ones: seeded random)")
    p.add_argument("--output", help=".npz to write the outputs to")
    p.add_argument("--print-time", action="store_true", help="time --repeat whole runs")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--profile", action="store_true", help="each kernel's time per run")
    p.add_argument("--no-sandbox", action="store_true", help="run without bubblewrap")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("lab", help="build a kernel's TVMScript and schedule; print its code, check and time")
    p.add_argument("code", nargs="?", help="a .py defining main (a TIR PrimFunc) and schedule(sch)")
    p.add_argument("--target", default="x86-host", help="a CPU preset (boards included)")
    p.add_argument("--show", default="asm", choices=["asm", "tir", "llvm", "mca"], help="the text to print")
    p.add_argument("--starter", help="print a starter kernel (matmul, conv2d_nhwc, ...) to begin from")
    p.add_argument("--no-sandbox", action="store_true", help="run without bubblewrap")
    p.set_defaults(func=cmd_lab)
    p = sub.add_parser("submit", help="send a job to a running playground and print its link")
    job_arguments(p, sandbox=False)
    p.add_argument("--server", required=True, help="the playground's address, e.g. http://localhost:8000")
    p.add_argument("--tune-trials", type=int, default=None, help="MetaSchedule trials")
    p.add_argument("--wait", action="store_true", help="wait until the job ends")
    p.set_defaults(func=cmd_submit)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
