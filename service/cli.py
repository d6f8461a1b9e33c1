"""The `faultline` command: diagnose, compress, serve, tail, rules."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TextIO

from rules.model import KeptLine
from rules.verdict import Diagnosis
from service.errors import FaultlineError
from service.pipeline import JobMeta, JobRun
from service.settings import Settings, load_settings
from service.sources import ProgressLine, check_readable, feed_path

EXIT_OK, EXIT_USAGE = 0, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line on standard error, exit 2 (argparse would print the whole usage)."""
        self.exit(EXIT_USAGE, f"faultline: error: {message} (see faultline {self.prog.split()[-1]} --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="faultline", description="Diagnose why a training job failed, from its logs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("diagnose", help="diagnose one job from its log files")
    p.add_argument("paths", nargs="+", metavar="PATH", help="log files of one job ('-' is stdin, .gz is read as gzip)")
    p.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    p.add_argument("--each", action="store_true", help="each PATH is its own job; one JSON object per line")
    p.add_argument("--job-name", default="", metavar="N", help="job name (finds rules learned for its family)")
    p.add_argument("--framework", default=None, metavar="F", help="framework, to use only its rule packs")

    p = sub.add_parser("serve", help="run the HTTP service")
    p.add_argument("--host", default="127.0.0.1", metavar="H")
    p.add_argument("--port", type=int, default=8080, metavar="P")
    p.add_argument("--workers", type=int, default=1, metavar="N", help="worker processes (uvicorn)")

    p = sub.add_parser("compress", help="print the kept lines of a log and what was filtered")
    p.add_argument("path", metavar="PATH")
    p.add_argument("--json", action="store_true")
    p.add_argument("--job-name", default="", metavar="N")
    p.add_argument("--framework", default=None, metavar="F")

    from service import rules_cli

    rules_cli.add_parser(sub, _Parser)
    return parser


def _context(settings: Settings):
    from service.context import Context  # heavy imports only when a command needs them

    return Context.open(settings)


def _run_job(ctx, paths: Sequence[str], meta: JobMeta, *, on_kept=None, progress: ProgressLine | None = None,
             diagnose: bool = True) -> tuple[JobRun, Diagnosis]:
    run = ctx.new_run(meta, diagnose=diagnose)
    for path in paths:
        feed_path(run, path, progress=progress, on_kept=on_kept)
    if progress is not None:
        progress.close()
    if not run.sources or all(r.stream.lines_in == 0 for r in run.sources.values()):
        raise _empty(paths)
    diagnosis = run.finish()
    ctx.after_run(run, diagnosis)
    return run, diagnosis


def _empty(paths: Sequence[str]) -> FaultlineError:
    from service.errors import BadInput

    return BadInput(f"no log lines in {', '.join(paths)}")


def cmd_diagnose(args: argparse.Namespace, out: TextIO) -> int:
    if args.each and not args.json:
        raise _usage("--each needs --json (one JSON object per line)")
    check_readable(args.paths)
    settings = load_settings()
    with _context(settings) as ctx:
        meta = JobMeta(name=args.job_name, framework=args.framework)
        if args.each:
            for path in args.paths:
                _, diagnosis = _run_job(ctx, [path], meta)
                out.write(json.dumps({"path": path, **diagnosis.to_dict()}) + "\n")
                out.flush()
            return EXIT_OK
        _, diagnosis = _run_job(ctx, args.paths, meta, progress=ProgressLine())
        out.write(json.dumps(diagnosis.to_dict(), indent=2) + "\n" if args.json else render(diagnosis))
    return EXIT_OK


def cmd_compress(args: argparse.Namespace, out: TextIO) -> int:
    check_readable([args.path])
    settings = load_settings()
    meta = JobMeta(name=args.job_name, framework=args.framework)
    with _context(settings) as ctx:
        if args.json:
            out.write('{"kept": [')
            first = [True]

            def emit_json(lines: list[KeptLine]) -> None:
                for line in lines:
                    out.write(("" if first[0] else ",") + "\n  " + json.dumps(line.text))
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


def cmd_serve(args: argparse.Namespace, _out: TextIO) -> int:
    import uvicorn

    settings = load_settings()
    settings.require_admin_token()
    if args.workers > 1:
        # each worker builds its own app from the same environment
        uvicorn.run("service.app:create_app", factory=True, host=args.host, port=args.port,
                    workers=args.workers, log_level="info")
    else:
        from service.app import create_app

        uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level="info")
    return EXIT_OK


def cmd_rules(args: argparse.Namespace, out: TextIO) -> int:
    from service import rules_cli

    return rules_cli.run(args, out)


_COMMANDS: dict[str, Callable[[argparse.Namespace, TextIO], int]] = {
    "diagnose": cmd_diagnose,
    "compress": cmd_compress,
    "serve": cmd_serve,
    "rules": cmd_rules,
}


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args, out or sys.stdout)
    except FaultlineError as exc:
        sys.stderr.write(f"faultline: error: {exc}\n")
        return EXIT_USAGE
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        sys.stderr.write("faultline: interrupted\n")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
