"""`faultline rules ...`: the rule store from the shell.

Each subcommand is one `Subcommand` in `SUBCOMMANDS`: a help line, a function that adds its
arguments, and a function that runs it and returns the exit status. Adding `approve`,
`reject`, `export` or `import` is adding an entry here; `service/cli.py` only calls
`add_parser` and `run`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from rules.model import RuleKind, RuleStatus
from service import store
from service.db import Database
from service.settings import load_settings

EXIT_OK = 0


@dataclass(frozen=True)
class Subcommand:
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, TextIO], int]


def open_db() -> Database:
    db = Database(load_settings().database_url)
    db.create_schema()
    return db


# -- list ------------------------------------------------------------------------------------
def _configure_list(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kind", choices=[k.value for k in RuleKind], metavar="K", help="filter or diagnosis")
    p.add_argument("--status", choices=[s.value for s in RuleStatus], metavar="S",
                   help="active, pending, rejected or disabled")
    p.add_argument("--scope", metavar="SCOPE", help="global, framework:<name> or family:<name>")
    p.add_argument("--source", metavar="SRC", help="e.g. log_agent (prefix match)")
    p.add_argument("--limit", type=int, default=200, metavar="N")
    p.add_argument("--json", action="store_true", help='one JSON object: {"total", "rules": [...]}')


def cmd_list(args: argparse.Namespace, out: TextIO) -> int:
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


SUBCOMMANDS: dict[str, Subcommand] = {
    "list": Subcommand("list stored rules with their provenance", _configure_list, cmd_list),
}


def add_parser(sub: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("rules", help="the rule store: learned, suggested and imported rules")
    rules_sub = p.add_subparsers(dest="rules_command", required=True, parser_class=parser_class)
    for name, command in SUBCOMMANDS.items():
        command.configure(rules_sub.add_parser(name, help=command.help))


def run(args: argparse.Namespace, out: TextIO) -> int:
    return SUBCOMMANDS[args.rules_command].run(args, out)
