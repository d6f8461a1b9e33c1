"""`faultline rules ...`: the rule store from the shell.

Each subcommand is one `Subcommand` in `SUBCOMMANDS`: a help line, a function that adds its
arguments, and a function that runs it and returns the exit status. Adding `approve`,
`reject`, `export` or `import` is adding an entry here; `service/cli.py` only calls
`add_parser` and `run`.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from rules.model import RuleKind, RuleStatus
from service.errors import BadInput

if TYPE_CHECKING:
    from service.store.db import Database

# The store (SQLAlchemy) and the settings (pydantic-settings) are imported by the commands
# that use them, not by `faultline --help`, which builds this parser too: importing them was
# half a second of every --help.

EXIT_OK = 0


@dataclass(frozen=True)
class Subcommand:
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, TextIO], int]
    examples: tuple[str, ...] = ()


def open_db() -> Database:
    from service.settings import load_settings
    from service.store.db import open_database

    return open_database(load_settings())


# -- list ------------------------------------------------------------------------------------
def _configure_list(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kind", choices=[k.value for k in RuleKind], metavar="K", help="filter or diagnosis")
    p.add_argument("--status", choices=[s.value for s in RuleStatus], metavar="S",
                   help="active, pending, rejected or disabled")
    p.add_argument("--scope", metavar="SCOPE", help="global, framework:<name> or family:<name>")
    p.add_argument("--source", metavar="SRC", help="e.g. log_agent (prefix match)")
    p.add_argument("--limit", type=int, default=200, metavar="N", help="at most this many rules (default 200)")
    p.add_argument("--json", action="store_true", help='one JSON object: {"total", "rules": [...]}')


def cmd_list(args: argparse.Namespace, out: TextIO) -> int:
    from service.store import jobs as store

    db = open_db()
    try:
        with db.session() as session:
            rows, total = store.list_rules(session, kind=args.kind, status=args.status, scope=args.scope,
                                           source=args.source, limit=max(1, args.limit))
            rules = [store.rule_to_dict(row) for row in rows]
    finally:
        db.close()
    if args.json:
        out.write(json.dumps({"total": total, "rules": rules}, indent=2) + "\n")
    else:
        out.write(render_rules(rules, total))
    return EXIT_OK


def _provenance_line(rule: dict[str, Any]) -> str:
    p = rule.get("provenance") or {}
    if not p:
        return ""
    parts = [f"{p.get('backend', '?')} ({p.get('model', '?')})"]
    if "votes" in p:
        parts.append(f"votes {p['votes']}/{p.get('k', '?')}")
    if "covers" in p:
        parts.append(f"covered {p['covers']} lines")
    job = (p.get("job") or {}).get("name")
    if job:
        parts.append(f"job {job}")
    return ", ".join(parts)


def render_rules(rules: list[dict[str, Any]], total: int) -> str:
    if not rules:
        return "no rules\n"
    lines = [f"{total} rule(s)" + (f", showing {len(rules)}" if len(rules) < total else "")]
    for r in rules:
        lines.append(f"{r['id']}  {r['kind']}  {r['status']}  {r['scope']}  {r['source']}  hits {r['hits']}")
        lines.append(f"    pattern: {r['pattern'][:200]}")
        prov = _provenance_line(r)
        if prov:
            lines.append(f"    learned by {prov}")
        evidence = (r.get("provenance") or {}).get("evidence") or []
        if evidence:
            lines.append(f"    e.g. {evidence[0][:160]}")
    return "\n".join(lines) + "\n"


# -- actor -------------------------------------------------------------------------------------------
def _add_actor(p: argparse.ArgumentParser) -> None:
    p.add_argument("--actor", default=None, metavar="NAME",
                   help="who the audit log names (default: cli:<your user name>)")


def actor_of(args: argparse.Namespace) -> str:
    if args.actor and args.actor.strip():
        return args.actor.strip()[:128]
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"cli:{user}"


def _review(db: Database):
    from service.admin.review import Review
    from rules.rulebook import Rulebook
    from service.store import jobs as store

    return Review(Rulebook(source=store.RuleStore(db)))


# -- approve / reject ------------------------------------------------------------------------------
def _configure_approve(p: argparse.ArgumentParser) -> None:
    p.add_argument("rule_id", metavar="ID", help="the rule's id (faultline rules list shows them)")
    p.add_argument("--note", default="", metavar="TEXT", help="why (kept with the rule and in the audit log)")
    _add_actor(p)
    p.add_argument("--json", action="store_true", help="print the rule as JSON")


def cmd_approve(args: argparse.Namespace, out: TextIO) -> int:
    from service.admin import review
    from service.store import jobs as store

    db = open_db()
    try:
        with db.session() as session:
            rule = store.rule_to_dict(review.approve(session, args.rule_id, actor=actor_of(args), note=args.note))
    finally:
        db.close()
    out.write(json.dumps(rule, indent=2) + "\n" if args.json else f"{rule['id']}: active (version {rule['version']})\n")
    return EXIT_OK


def _configure_reject(p: argparse.ArgumentParser) -> None:
    p.add_argument("rule_id", metavar="ID", help="the rule's id (faultline rules list shows them)")
    p.add_argument("--reason", required=True, metavar="TEXT", help="why the rule is rejected (required)")
    _add_actor(p)
    p.add_argument("--json", action="store_true", help="print the rule as JSON")


def cmd_reject(args: argparse.Namespace, out: TextIO) -> int:
    from service.admin import review
    from service.store import jobs as store

    db = open_db()
    try:
        with db.session() as session:
            rule = store.rule_to_dict(review.reject(session, args.rule_id, actor=actor_of(args), reason=args.reason))
    finally:
        db.close()
    out.write(json.dumps(rule, indent=2) + "\n" if args.json
              else f"{rule['id']}: rejected (version {rule['version']}): {rule['review_note']}\n")
    return EXIT_OK


# -- export / import ---------------------------------------------------------------------------------
def _configure_export(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kind", choices=[k.value for k in RuleKind], metavar="K", help="filter or diagnosis")
    p.add_argument("--status", default="active", choices=[*(s.value for s in RuleStatus), "all"], metavar="S",
                   help="active (default), pending, rejected, disabled or all")
    p.add_argument("--scope", metavar="SCOPE", help="global, framework:<name> or family:<name>")
    p.add_argument("-o", "--output", metavar="FILE", help="write the pack here (default: standard output)")
    _add_actor(p)


def cmd_export(args: argparse.Namespace, out: TextIO) -> int:
    from service.admin import review

    db = open_db()
    try:
        with db.session() as session:
            text, count = review.export_pack(session, kind=args.kind, scope=args.scope, actor=actor_of(args),
                                             status=None if args.status == "all" else args.status)
    finally:
        db.close()
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as handle:
                handle.write(text)
        except OSError as exc:
            raise BadInput(f"cannot write {args.output}: {exc.strerror or exc}") from None
        sys.stderr.write(f"exported {count} rule(s) to {args.output}\n")
    else:
        out.write(text)
    return EXIT_OK


def _configure_import(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="PATH", help="a YAML rule pack ('-' is standard input)")
    p.add_argument("--status", default="pending", choices=["pending", "active"],
                   help="status of the new rules (default pending: they wait for review)")
    p.add_argument("--on-conflict", default="skip", choices=["skip", "replace", "fail"],
                   help="a stored rule of the same id and other content: keep it (skip), "
                        "make a new version of it (replace), or import nothing (fail)")
    _add_actor(p)
    p.add_argument("--json", action="store_true", help="print what became of each rule as JSON")


def cmd_import(args: argparse.Namespace, out: TextIO) -> int:
    if args.path == "-":
        text = sys.stdin.read()
    else:
        try:
            with open(args.path, encoding="utf-8") as handle:
                text = handle.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise BadInput(f"cannot read {args.path}: {getattr(exc, 'strerror', None) or exc}") from None
    db = open_db()
    try:
        reviewer = _review(db)
        with db.session() as session:
            result = reviewer.import_pack(session, text, actor=actor_of(args), status=args.status,
                                          on_conflict=args.on_conflict)
    finally:
        db.close()
    if args.json:
        out.write(json.dumps(result, indent=2) + "\n")
    else:
        counts = ", ".join(f"{len(v)} {k}" for k, v in result.items() if isinstance(v, list))
        out.write(f"imported as {result['status']}: {counts}\n")
        for rule_id in result["skipped"]:
            out.write(f"  skipped {rule_id}: stored with other content (see --on-conflict)\n")
    return EXIT_OK


SUBCOMMANDS: dict[str, Subcommand] = {
    "list": Subcommand("list stored rules with their provenance", _configure_list, cmd_list, (
        "faultline rules list --status pending", "faultline rules list --source log_agent --json | jq '.rules[].id'")),
    "approve": Subcommand("make a suggested rule active", _configure_approve, cmd_approve, (
        "faultline rules approve diag-3f2a9c1e07 --note 'matches the NCCL 2.21 wording'",)),
    "reject": Subcommand("reject a rule, with a reason", _configure_reject, cmd_reject, (
        "faultline rules reject la-0123456789 --reason 'drops the torchrun failure box'",)),
    "export": Subcommand("write rules as a YAML rule pack", _configure_export, cmd_export, (
        "faultline rules export -o active-rules.yaml", "faultline rules export --status all --kind diagnosis")),
    "import": Subcommand("read a YAML rule pack; every rule is validated", _configure_import, cmd_import, (
        "faultline rules import team-rules.yaml", "faultline rules import team-rules.yaml --status active "
        "--on-conflict replace")),
}


def add_parser(sub: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("rules", help="the rule store: learned, suggested and imported rules",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Review the rules the agents learned and suggested, and share rule packs.",
                       epilog="examples:\n  faultline rules list --status pending\n  faultline rules approve --help")
    rules_sub = p.add_subparsers(dest="rules_command", required=True, parser_class=parser_class,
                                 help="what to do with the stored rules")
    for name, command in SUBCOMMANDS.items():
        command.configure(rules_sub.add_parser(
            name, help=command.help, description=command.help[:1].upper() + command.help[1:] + ".",
            epilog="examples:\n" + "".join(f"  {line}\n" for line in command.examples),
            formatter_class=argparse.RawDescriptionHelpFormatter))


def run(args: argparse.Namespace, out: TextIO) -> int:
    return SUBCOMMANDS[args.rules_command].run(args, out)
