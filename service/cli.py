"""The `faultline` command: diagnose, compress, serve, tail, rules."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from service.errors import ConfigError, FaultlineError

if TYPE_CHECKING:
    from rules.job import JobMeta, JobRun
    from service.settings import Settings
    from rules.model import KeptLine
    from rules.verdict import Diagnosis
    from service.ingest.sources import ProgressLine

# The job core (rules/, service/ingest) is imported by the commands that run jobs: `faultline
# tail` on a training node needs only httpx and the settings (`pip install faultline` without
# the `server` extra), and --help need not load the rules.

EXIT_OK, EXIT_USAGE = 0, 2


def load_settings(**overrides: Any) -> Settings:
    # pydantic-settings is a third of `faultline --help`'s start: read on first use
    from service.settings import load_settings as load

    return load(**overrides)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line on standard error, exit 2 (argparse would print the whole usage)."""
        self.exit(EXIT_USAGE, f"faultline: error: {message} (see {self.prog} --help)\n")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("faultline")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """argparse's `version` action, but the version is read only when asked for: reading the
    installed package's metadata costs 20 ms of every other command's start."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any):
        super().__init__(option_strings, dest, nargs=0, help="show the program's version and exit", **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> NoReturn:
        sys.stdout.write(f"faultline {_version()}\n")
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="faultline", description="Diagnose why a training job failed, from its logs.")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser(
        "diagnose", help="diagnose one job from its log files", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Name why a training job failed (root cause, origin, action, suspect nodes, progress) from\n"
                    "its log files: all PATHs are one job, e.g. one file per rank. Exit 0 when a diagnosis\n"
                    "was made, 2 for bad usage or unreadable input.",
        epilog="examples:\n"
               "  faultline diagnose train.log\n"
               "  faultline diagnose logs/rank*.log --job-name gpt-7b-pretrain --json\n"
               "  kubectl logs job/gpt-7b | faultline diagnose -\n"
               "  faultline diagnose --each --json old-jobs/*.log.gz > diagnoses.jsonl\n"
               "  faultline diagnose train.log --error-file '/tmp/torchelastic_*/**/error.json'")
    p.add_argument("paths", nargs="+", metavar="PATH", help="log files of one job ('-' is stdin, .gz is read as gzip)")
    p.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    p.add_argument("--each", action="store_true", help="each PATH is its own job; one JSON object per line")
    p.add_argument("--job-name", default="", metavar="N", help="job name (finds rules learned for its family)")
    p.add_argument("--framework", default=None, metavar="F", help="framework, to use only its rule packs")
    p.add_argument("--no-learn", action="store_true",
                   help="store nothing: rules learned or suggested stay in this run (the store is only read)")
    p.add_argument("--error-file", action="append", default=[], metavar="PATH", dest="error_files",
                   help="a torchrun/elastic JSON error file (@record, TORCHELASTIC_ERROR_FILE) as evidence; "
                        "repeatable, globs allowed, e.g. '/tmp/torchelastic_*/**/error.json'")

    p = sub.add_parser(
        "serve", help="run the HTTP service", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The HTTP service: POST /diagnose, live jobs (/jobs), the admin's rule review (/admin),\n"
                    "/metrics, /healthz and the API documentation (/docs). Settings come from FAULTLINE_*\n"
                    "variables or the TOML file FAULTLINE_CONFIG names (README.md lists them).",
        epilog="examples:\n"
               "  FAULTLINE_ADMIN_TOKEN=$(openssl rand -hex 16) faultline serve\n"
               "  FAULTLINE_API_TOKENS=cluster-a:ingest+read:$TOKEN faultline serve --host 0.0.0.0 --workers 2\n"
               "  curl -H 'Content-Type: text/plain' --data-binary @train.log localhost:8080/diagnose")
    p.add_argument("--host", default="127.0.0.1", metavar="H",
                   help="address to listen on (default 127.0.0.1; any other needs FAULTLINE_API_TOKENS or --insecure)")
    p.add_argument("--port", type=int, default=8080, metavar="P", help="port to listen on (default 8080)")
    p.add_argument("--workers", type=int, default=1, metavar="N", help="worker processes (uvicorn)")
    p.add_argument("--insecure", action="store_true",
                   help="serve the job API without tokens on a non-loopback address (anyone who reaches the port "
                        "can read and write jobs); without it, such an address needs FAULTLINE_API_TOKENS")

    p = sub.add_parser(
        "compress", help="print the kept lines of a log and what was filtered",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="What the filter keeps of a log (errors, their context, what no rule knows) and what it\n"
                    "threw away, per rule. The Log Agent runs here too: the filter rules it learns for the\n"
                    "job's family are stored (said on standard error) unless --no-learn.",
        epilog="examples:\n"
               "  faultline compress train.log | less\n"
               "  faultline compress train.log.gz --job-name gpt-7b-pretrain --json | jq .lines_kept")
    p.add_argument("path", metavar="PATH", help="one log file ('-' is stdin, .gz is read as gzip)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object: lines_in, lines_kept, bytes_in, rules_learned, kept")
    p.add_argument("--job-name", default="", metavar="N", help="job name (finds rules learned for its family)")
    p.add_argument("--framework", default=None, metavar="F", help="framework, to use only its rule packs")
    p.add_argument("--no-learn", action="store_true",
                   help="store nothing: filter rules learned stay in this run (the store is only read)")

    p = sub.add_parser("eval", help="score diagnose on a folder of labelled logs, beside naive baselines",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Diagnose every log listed in DIR/labels.jsonl (file, reason, category, origin,\n"
                                   "root_cause_line) on a fresh temporary store and score the answers beside two\n"
                                   "naive baselines: the first error line and the last exception line.",
                       epilog="examples:\n"
                              "  faultline eval fixtures/real --split test\n"
                              "  faultline eval my-incidents/ --json | jq .figures.ours")
    p.add_argument("folder", metavar="DIR", help="a folder with labels.jsonl and the logs it names")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    p.add_argument("--split", default=None, metavar="S", help="only the logs of this split (dev or test)")

    p = sub.add_parser("db", help="the database schema (migrations)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="The store's schema, kept by migrations: `serve` and the other commands bring it\n"
                                   "to the newest revision at start, under a lock (unless FAULTLINE_DB_AUTO_UPGRADE\n"
                                   "is false); `upgrade` does it as a step of its own, `current` prints the revision.",
                       epilog="examples:\n"
                              "  faultline db current\n"
                              "  FAULTLINE_DATABASE_URL=postgresql://user:pw@host/db faultline db upgrade")
    p.add_argument("action", choices=["upgrade", "current"],
                   help="upgrade: bring the schema to the newest revision; current: print its revision")
    _tail_parser(sub)

    from service.admin import rules_cli

    rules_cli.add_parser(sub, _Parser)
    return parser


def _size(text: str) -> int:
    """A byte count: `65536`, `64K`, `1M`, `2G`."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, re.I)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 1M, 64K, 65536)")
    return int(match.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[match.group(2).upper()]


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def _tail_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tail", help="the sidecar: follow a job's log files and send them to the service",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Follow log files (globs allowed) and send their lines to a Faultline server\n"
                                   "until stopped; with `-- COMMAND...`, run the command, tee its output, and\n"
                                   "report its exit status when it ends.",
                       epilog="examples:\n"
                              "  faultline tail --server http://faultline:8080 --job-name gpt-7b 'logs/rank*.log'\n"
                              "  faultline tail --server http://faultline:8080 --job-name gpt-7b --tee train.log "
                              "-- torchrun ...\n"
                              "  faultline tail --once --exit-code 137 --job-key $SLURM_JOB_ID --job-name gpt-7b "
                              "'logs/rank*.log'")
    p.add_argument("paths", nargs="*", metavar="PATH", help="log files or globs (quote them), e.g. 'logs/rank*.log'")
    p.add_argument("--server", default=None, metavar="URL",
                   help="the Faultline service, e.g. http://faultline:8080 (default: FAULTLINE_SERVER_URL)")
    p.add_argument("--job-name", required=True, metavar="N", help="job name (finds rules learned for its family)")
    p.add_argument("--job-key", default=None, metavar="K",
                   help="the scheduler's job id; sidecars on several nodes with the same key share one job")
    p.add_argument("--framework", default=None, metavar="F", help="framework, to use only its rule packs")
    p.add_argument("--tag", action="append", default=[], metavar="T", dest="tags", help="job tag (repeatable)")
    p.add_argument("--from", dest="read_from", choices=("beginning", "end"), default="beginning",
                   help="where to start in files present at startup that have no checkpoint (default beginning)")
    p.add_argument("--state-dir", default=None, metavar="DIR",
                   help="where offsets are checkpointed (default: under FAULTLINE_DATA_DIR/sidecar)")
    p.add_argument("--batch-bytes", type=_size, default=4 << 20, metavar="N",
                   help="most bytes of lines per request (small batches leave after --flush-interval)")
    p.add_argument("--buffer-bytes", type=_size, default=32 << 20, metavar="N",
                   help="read ahead of the server at most this much; past it, reading waits")
    p.add_argument("--max-line-bytes", type=_size, default=256 << 10, metavar="N",
                   help="longer lines keep their head, the rest is skipped")
    p.add_argument("--partial-timeout", type=_seconds, default=5.0, metavar="S",
                   help="send a last line without its newline after this long")
    p.add_argument("--flush-interval", type=_seconds, default=0.5, metavar="S",
                   help="send small batches after this long")
    p.add_argument("--poll-interval", type=_seconds, default=0.2, metavar="S",
                   help="how often the files are checked for new bytes (default 0.2 s)")
    p.add_argument("--glob-interval", type=_seconds, default=1.0, metavar="S", help="rescan the globs this often")
    p.add_argument("--rotate-wait", type=_seconds, default=10.0, metavar="S",
                   help="keep reading a rotated or deleted file until it is idle this long")
    p.add_argument("--drain-timeout", type=_seconds, default=60.0, metavar="S",
                   help="at the end, how long to keep delivering what is left")
    p.add_argument("--retry-max", type=_seconds, default=10.0, metavar="S", help="longest wait between retries")
    p.add_argument("--gzip", action="store_true", help="compress request bodies")
    p.add_argument("--source-prefix", default="", metavar="P",
                   help="prefix for file names in diagnoses (e.g. the node name, when nodes share file names)")
    p.add_argument("--once", action="store_true", help="send what the files hold now and exit (an epilog)")
    p.add_argument("--exit-code", type=int, default=None, metavar="N", help="with --once: report this exit status")
    p.add_argument("--finish-on-stop", action="store_true",
                   help="report the end of the job when stopped (SIGTERM), e.g. as a pod's sidecar container")
    p.add_argument("--exit-code-file", default=None, metavar="F", help="where the training writes its exit status")
    p.add_argument("--tee", default=None, metavar="FILE",
                   help="with a command: where its output goes (followed too; default in the state dir)")
    p.add_argument("--error-files", action="append", default=[], metavar="GLOB", dest="error_files",
                   help="torchrun error files (@record, TORCHELASTIC_ERROR_FILE), e.g. '/tmp/torchelastic_*/**/error.json': "
                        "sent as evidence when the job ends (repeatable)")
    p.add_argument("--token-file", default=None, metavar="F",
                   help="a file holding the bearer token (scopes ingest+read) for a server with FAULTLINE_API_TOKENS; "
                        "default: FAULTLINE_TOKEN")
    p.add_argument("--quiet", action="store_true", help="only warnings on standard error")


def split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """`faultline tail ... -- torchrun ...`: the sidecar's arguments and the command."""
    argv = list(argv)
    if argv[:1] == ["tail"] and "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1:]
    return argv, []


def _context(settings: Settings, *, learn: bool = True):
    from service.context import Context  # heavy imports only when a command needs them

    return Context.open(settings, learn=learn)


def _run_job(ctx, paths: Sequence[str], meta: JobMeta, *, on_kept=None, progress: ProgressLine | None = None,
             diagnose: bool = True, error_files: Sequence[tuple[str, bytes]] = ()) -> tuple[JobRun, Diagnosis]:
    from service.ingest.sources import feed_path

    run = ctx.new_run(meta, diagnose=diagnose)
    if diagnose and ctx.failure_agent is not None:
        ctx.failure_agent.on_load = _say_agent_loads
    for path in paths:
        feed_path(run, path, progress=progress, on_kept=on_kept)
    for name, text in error_files:  # each failing rank's recorded exception, a source of its own
        run.feed(name, text)
    if progress is not None:
        progress.close()
    if not run.sources or all(r.stream.lines_in == 0 for r in run.sources.values()):
        raise _empty(paths)
    diagnosis = run.finish()
    ctx.after_run(run, diagnosis)
    _say_what_was_stored(ctx, run, diagnosis)
    return run, diagnosis


def _say_agent_loads() -> None:
    sys.stderr.write("faultline: no rule explains this failure for sure: loading the Failure Agent "
                     "(its embedding model and knowledge base, a few seconds and about 600 MB the first time)\n")
    sys.stderr.flush()


def _say_what_was_stored(ctx, run: JobRun, diagnosis: Diagnosis) -> None:
    """One line on standard error when this run left rules in the store: the next run of a
    job of the same family (or every run, for pending rules once approved) will use them."""
    from agents.log_agent import learned_scope
    from rules.redact import redact_text

    suggested = [r for r in diagnosis.suggested_rules if r.get("kind") == "diagnosis"]
    if not ctx.learn or (not run.learned and not suggested):
        return
    scope, status = learned_scope(run.meta)
    what = []
    if run.learned:
        what.append(f"{len(run.learned)} filter rule{'s' if len(run.learned) != 1 else ''} learned "
                    f"({status.value}, scope {scope})")
    if suggested:
        what.append(f"{len(suggested)} diagnosis rule{'s' if len(suggested) != 1 else ''} suggested (pending review)")
    sys.stderr.write(f"faultline: {' and '.join(what)}, stored in {redact_text(ctx.settings.database_url)}\n")


def _empty(paths: Sequence[str]) -> FaultlineError:
    from service.errors import BadInput

    return BadInput(f"no log lines in {', '.join(paths)}")


def cmd_diagnose(args: argparse.Namespace, out: TextIO) -> int:
    if args.each and not args.json:
        raise _usage("--each needs --json (one JSON object per line)")
    if args.each and args.error_files:
        raise _usage("--error-file belongs to one job: it cannot go with --each")
    from rules.job import JobMeta
    from service.ingest.lines import reuse_freed_buffers
    from service.ingest.sources import ProgressLine, check_readable

    if not args.each:
        check_readable(args.paths)  # with --each, each file is checked in its turn
    from service.ingest.error_files import error_file_text, expand

    error_files = [(path, error_file_text(path)) for path in expand(args.error_files)]
    reuse_freed_buffers()
    settings = load_settings()
    with _context(settings, learn=not args.no_learn) as ctx:
        meta = JobMeta(name=args.job_name, framework=args.framework)
        if args.each:
            # one bad file is reported on its own line and the batch goes on: a directory of
            # 500 logs is not lost to one truncated upload; the exit status says one failed
            failed = False
            for path in args.paths:
                try:
                    check_readable([path])
                    _, diagnosis = _run_job(ctx, [path], meta)
                except FaultlineError as exc:
                    failed = True
                    sys.stderr.write(f"faultline: error: {exc}\n")
                    out.write(json.dumps({"path": path, "error": str(exc)}) + "\n")
                else:
                    out.write(json.dumps({"path": path, **diagnosis.to_dict()}) + "\n")
                out.flush()
            return EXIT_USAGE if failed else EXIT_OK
        _, diagnosis = _run_job(ctx, args.paths, meta, progress=ProgressLine(), error_files=error_files)
        out.write(json.dumps(diagnosis.to_dict(), indent=2) + "\n" if args.json else render(diagnosis))
    return EXIT_OK


def cmd_compress(args: argparse.Namespace, out: TextIO) -> int:
    from rules.job import JobMeta
    from service.ingest.lines import reuse_freed_buffers
    from service.ingest.sources import ProgressLine, check_readable

    check_readable([args.path])
    reuse_freed_buffers()
    settings = load_settings()
    meta = JobMeta(name=args.job_name, framework=args.framework)
    with _context(settings, learn=not args.no_learn) as ctx:
        if args.json:
            out.write('{"kept": [')
            first = [True]

            def emit_json(lines: list[KeptLine]) -> None:
                if not lines:
                    return
                # one write per batch, each text as json.dumps writes a string (its C encoder,
                # called directly: a log whose every line is kept was a third json.dumps calls)
                quoted = json.encoder.encode_basestring_ascii
                out.write(("" if first[0] else ",") + ",".join("\n  " + quoted(line.text) for line in lines))
                first[0] = False

            run, diagnosis = _run_job(ctx, [args.path], meta, on_kept=emit_json, diagnose=False)
            summary = {**diagnosis.compression, "filtered": diagnosis.filtered,
                       "learned": [_rule_view(r) for r in run.learned]}
            out.write("\n]," + json.dumps(summary)[1:] + "\n")
            return EXIT_OK

        def emit_text(lines: list[KeptLine]) -> None:
            out.write("".join(f"{line.line_number}: {line.text}\n" for line in lines))

        run, diagnosis = _run_job(ctx, [args.path], meta, on_kept=emit_text, progress=ProgressLine(), diagnose=False)
        out.write(render_compression(diagnosis, run))
    return EXIT_OK


def _rule_view(rule) -> dict[str, Any]:
    return {"id": rule.id, "pattern": rule.pattern, "scope": rule.scope, "source": rule.source,
            "description": rule.description}


def render(d: Diagnosis) -> str:
    """The diagnosis for a person."""
    lines = [f"status: {d.status}"]
    rc = d.root_cause
    if rc is not None:
        where = ", ".join(x for x in (f"rank {rc.rank}" if rc.rank is not None else "",
                                       f"node {rc.node}" if rc.node else "") if x)
        lines += [
            f"root cause: {rc.reason} ({rc.category or '-'}, origin {rc.origin}, confidence {rc.confidence:.2f}, {rc.source})",
            f"  {rc.file}:{rc.line_number}{'  [' + where + ']' if where else ''}",
            f"  {rc.line}",
        ]
    lines.append(f"action: {d.action}")
    if d.suspect_nodes:
        lines.append(f"suspect nodes: {', '.join(d.suspect_nodes)}")
    if d.mitigation:
        lines.append(f"mitigation: {d.mitigation}")
    if d.other_errors:
        lines.append("other errors:")
        lines += [f"  {e['count']:>6} x {e['reason']}: {e['line'][:160]}" for e in d.other_errors[:10]]
    p = d.progress
    if p.get("last_step") is not None:
        lines.append(f"progress: step {p['last_step']}, loss {p.get('last_loss')}")
    c = d.compression
    lines.append(f"log: {c.get('lines_in', 0):,} lines, {c.get('lines_kept', 0):,} kept, "
                 f"{c.get('bytes_in', 0) / 1e6:,.1f} MB")
    return "\n".join(lines) + "\n"


def render_compression(d: Diagnosis, run: JobRun) -> str:
    c = d.compression
    lines = [f"# {c['lines_in']:,} lines in, {c['lines_kept']:,} kept, {c['rules_learned']} rules learned"]
    lines += [f"# filtered {f['count']:>10,} x {f['rule']} (lines {f['first_line']}-{f['last_line']})"
              for f in d.filtered]
    return "\n".join(lines) + "\n"


def _usage(message: str) -> FaultlineError:
    from service.errors import BadInput

    return BadInput(message)


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def cmd_serve(args: argparse.Namespace, _out: TextIO) -> int:
    import uvicorn

    settings = load_settings()
    settings.require_admin_token()
    if not settings.api_credentials() and not args.insecure and not _is_loopback(args.host):
        raise ConfigError(f"--host {args.host} is reachable from other machines and FAULTLINE_API_TOKENS is not set: "
                          "anyone could read and write jobs. Set FAULTLINE_API_TOKENS (name:scopes:token,...) "
                          "or pass --insecure")
    # the database first, here: unreachable, it is one line and exit 2 after the retries,
    # not a traceback from each worker's start-up
    from service.store.db import open_database

    open_database(settings).close()
    if args.workers > 1:
        import shutil
        import tempfile

        from service.metrics import MULTIPROCESS_DIR

        # each worker builds its own app from the same environment; their metrics go to one
        # fresh folder that every worker's /metrics sums (stale files would add old counts)
        ours = None if os.environ.get(MULTIPROCESS_DIR) else tempfile.mkdtemp(prefix="faultline-metrics-")
        if ours:
            os.environ[MULTIPROCESS_DIR] = ours
        try:
            uvicorn.run("service.app:create_app", factory=True, host=args.host, port=args.port,
                        workers=args.workers, log_level="info")
        finally:
            if ours:
                shutil.rmtree(ours, ignore_errors=True)
    else:
        from service.app import create_app

        uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level="info")
    return EXIT_OK


def cmd_eval(args: argparse.Namespace, out: TextIO) -> int:
    from pathlib import Path

    from service import evaluate

    folder = Path(args.folder)
    if not folder.is_dir():
        raise _usage(f"{folder}: not a folder")
    def progress(done: int, total: int) -> None:
        # on a terminal only: the first log that needs the Failure Agent loads its model
        sys.stderr.write(f"\rscored {done} of {total} logs" + ("\n" if done == total else ""))
        sys.stderr.flush()

    report = evaluate.run_eval(folder, split=args.split, on_progress=progress if sys.stderr.isatty() else None)
    out.write(json.dumps(report.to_dict(), indent=2) + "\n" if args.json else evaluate.render(report))
    return EXIT_OK


def cmd_db(args: argparse.Namespace, out: TextIO) -> int:
    from service.store import migrate
    from service.store.db import Database

    settings = load_settings()
    db = Database(settings.database_url)
    try:
        if args.action == "upgrade":
            before = migrate.upgrade(db.engine)
            out.write(f"database schema: {before or 'empty'} -> {migrate.head_revision()}\n")
        else:
            with db.engine.connect() as connection:
                found = migrate.current_revision(connection)
            state = "current" if found == migrate.head_revision() else f"behind {migrate.head_revision()}"
            out.write(f"{found or 'none'} ({state})\n")
    finally:
        db.close()
    return EXIT_OK


def _client_token(path: str | None, settings: Settings) -> str | None:
    """The sidecar's token: from a file (a mounted secret), else FAULTLINE_TOKEN; never a flag,
    which every user of the node could read in the process list."""
    from pathlib import Path

    from service.errors import BadInput

    if path:
        try:
            token = Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise BadInput(f"--token-file {path}: {exc.strerror if isinstance(exc, OSError) else exc}") from None
        if not token:
            raise BadInput(f"--token-file {path} is empty")
        return token
    return settings.token.get_secret_value().strip() or None


def cmd_tail(args: argparse.Namespace, _out: TextIO) -> int:
    import logging
    from pathlib import Path

    from service.errors import BadInput
    from service.sidecar.run import Sidecar, SidecarConfig, default_state_dir
    from service.sidecar.tailer import TailConfig

    command = tuple(getattr(args, "command_argv", ()) or ())
    if args.exit_code is not None and not args.once:
        raise BadInput("--exit-code goes with --once (a command's own exit status is reported by itself)")
    if command and args.once:
        raise BadInput("--once cannot run a command")
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, stream=sys.stderr,
                        format="faultline tail: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise
    settings = load_settings()
    server = (args.server or settings.server_url).rstrip("/")
    if not server:
        raise BadInput("--server URL is required (or set FAULTLINE_SERVER_URL)")
    key = args.job_key or args.job_name
    state_dir = Path(args.state_dir) if args.state_dir else default_state_dir(
        settings.data_dir, server, key, tuple(args.paths) + command)
    try:
        config = SidecarConfig(
            server=server, job_name=args.job_name, paths=tuple(args.paths), state_dir=state_dir,
            tail=TailConfig(read_from=args.read_from, max_line_bytes=args.max_line_bytes, batch_bytes=args.batch_bytes,
                            partial_timeout_s=args.partial_timeout, batch_timeout_s=args.flush_interval,
                            rotate_wait_s=args.rotate_wait, source_prefix=args.source_prefix),
            framework=args.framework, tags=tuple(args.tags), job_key=args.job_key, buffer_bytes=args.buffer_bytes,
            poll_interval_s=args.poll_interval, glob_interval_s=args.glob_interval,
            drain_timeout_s=args.drain_timeout, retry_max_s=args.retry_max, gzip=args.gzip, once=args.once,
            exit_code=args.exit_code, finish_on_stop=args.finish_on_stop,
            exit_code_file=Path(args.exit_code_file) if args.exit_code_file else None,
            command=command, tee=Path(args.tee) if args.tee else None, error_files=tuple(args.error_files),
            token=_client_token(args.token_file, settings))
        sidecar = Sidecar(config)
    except (ValueError, RuntimeError) as exc:
        raise BadInput(str(exc)) from None
    try:
        return sidecar.run()
    except RuntimeError as exc:
        raise BadInput(str(exc)) from None


def cmd_rules(args: argparse.Namespace, out: TextIO) -> int:
    from service.admin import rules_cli

    return rules_cli.run(args, out)


_COMMANDS: dict[str, Callable[[argparse.Namespace, TextIO], int]] = {
    "diagnose": cmd_diagnose,
    "compress": cmd_compress,
    "serve": cmd_serve,
    "db": cmd_db,
    "eval": cmd_eval,
    "tail": cmd_tail,
    "rules": cmd_rules,
}


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    argv, command = split_command(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    args.command_argv = command
    try:
        return _COMMANDS[args.command](args, out or sys.stdout)
    except FaultlineError as exc:
        sys.stderr.write(f"faultline: error: {exc}\n")
        return EXIT_USAGE
    except BrokenPipeError:
        return EXIT_OK
    except ModuleNotFoundError as exc:
        # `pip install faultline` is the sidecar alone; the rest is the `server` extra
        sys.stderr.write(f"faultline: error: `faultline {args.command}` needs the package {exc.name!r}, "
                         "which the sidecar-only install leaves out: pip install 'faultline[server]'\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("faultline: interrupted\n")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
