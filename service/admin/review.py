"""Review of stored rules by a person: details, approve and reject, edits re-validated,
dry-runs over the stored jobs, and rule packs (YAML) to share rules between clusters.

The HTTP admin routes, the /admin page and `faultline rules ...` all call this module, so
each action behaves the same and leaves the same audit entry whichever way it was done.
Functions take a session; none speaks HTTP. Errors are `service.errors` classes (404, 409,
422) that the routes turn into JSON and the CLI into a one-line message.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import yaml
from pydantic import ValidationError
from sqlalchemy.orm import Session

from agents.samples import HELD_OUT_HEALTHY
from agents.validation import Validation, Validator, load_error_corpus, validate_diagnosis_rule
from rules.classifier import DiagnosisCompileError
from rules.filters import FilterCompileError, FilterProgram
from rules.model import DiagnosisRule, FilterRule, KeptLine, RuleKind, RuleStatus, Tier
from rules.pack_schema import RULE_ID_PATTERN, DiagnosisRuleSpec, FilterRuleSpec, Pack
from rules.pack_schema import problems as pack_problems
from rules.packs import PackError, StrictLoader, diagnosis_rule_from_spec, filter_rule_from_spec
from rules.taxonomy import Action, Origin, is_reason
from service.store import jobs as store
from service.errors import Conflict, NotFound, Unprocessable
from service.store.models import Job, RuleRow
from rules.job import JobMeta, JobRun
from rules.rulebook import Rulebook

PACK_FORMAT = "faultline-rules/1"
SCOPE_RE = re.compile(r"global|(?:framework|family):[a-z0-9][a-z0-9._+-]{0,200}")
RULE_ID_RE = re.compile(RULE_ID_PATTERN)
EVIDENCE_CUT = 500
"""The Log Agent stores evidence lines cut at this length; a cut line is not an example."""
STORED_ERROR_LINES = 5000
MAX_PACK_RULES = 10_000
MAX_NOTE_CHARS = 2000
RESERVED_IDS = frozenset({"export", "import"})
"""Path segments of the admin API: a rule so named could not be read at /admin/rules/<id>."""
DRY_RUN_JOBS = 100
DRY_RUN_MAX_JOBS = 1000
SAMPLE_LINES = 3

FILTER_FIELDS = frozenset({"pattern", "description", "scope", "examples"})
DIAGNOSIS_FIELDS = frozenset({"pattern", "patterns", "description", "scope", "examples", "counter_examples",
                              "reason", "tier", "origin", "action", "mitigation"})
CONTENT_FIELDS = ("kind", "scope", "pattern", "patterns", "description", "reason", "tier", "origin", "action",
                  "mitigation")


# -- views -------------------------------------------------------------------------------------
def examples_of(row: RuleRow) -> list[str]:
    """The lines a rule is known to match: its evidence (learned) or examples (imported)."""
    evidence = (row.provenance or {}).get("evidence") or []
    return [e for e in evidence if isinstance(e, str) and len(e) < EVIDENCE_CUT]


def rule_summary(row: RuleRow) -> dict[str, Any]:
    """A rule as listed: the stored fields plus who proposed it and how the vote went."""
    data = store.rule_to_dict(row)
    p = row.provenance or {}
    data["proposer"] = {"source": row.source, "backend": p.get("backend"), "model": p.get("model"),
                        "job": (p.get("job") or {}).get("name")}
    data["votes"] = ({k: p[k] for k in ("votes", "k", "quorum", "voters", "failed_votes", "tie_break") if k in p}
                     if "votes" in p else None)
    data["evidence"] = list(p.get("evidence") or [])
    data["validation"] = dict(p.get("validation") or {})
    return data


def rule_detail(session: Session, row: RuleRow) -> dict[str, Any]:
    """Everything a reviewer needs about one rule: summary, versions and its audit trail."""
    data = rule_summary(row)
    data["versions"] = [store.version_to_dict(v) for v in store.rule_history(session, row.id)]
    entries, _ = store.audit_entries(session, target=row.id, limit=200)
    data["audit"] = [store.audit_to_dict(e) for e in entries]
    return data


def require_rule(session: Session, rule_id: str) -> RuleRow:
    row = store.get_rule(session, rule_id)
    if row is None:
        raise NotFound(f"no rule {shown(rule_id)}")
    return row


def shown(value: Any, limit: int = 80) -> str:
    """repr() of a value from a request, cut short: an error message must not echo megabytes."""
    text = repr(value) if not isinstance(value, list | dict) else f"a {type(value).__name__}"
    return text if len(text) <= limit else text[:limit] + "…"


# -- status changes ----------------------------------------------------------------------------
def approve(session: Session, rule_id: str, *, actor: str, note: str = "") -> RuleRow:
    """Make a rule active. An approved diagnosis rule confirms the diagnosis of its evidence
    lines: they join the Failure Agent's knowledge base with the rule's label."""
    from service.store.incidents import confirm_approved_rule

    row = require_rule(session, rule_id)
    if row.status == RuleStatus.ACTIVE:
        raise Conflict(f"rule {rule_id!r} is already active")
    row = store.set_rule_status(session, row, RuleStatus.ACTIVE, actor=actor, note=_note(note, required=False))
    confirm_approved_rule(session, row)
    return row


def reject(session: Session, rule_id: str, *, actor: str, reason: str) -> RuleRow:
    reason = _note(reason, required=True)
    row = require_rule(session, rule_id)
    if row.status == RuleStatus.REJECTED:
        raise Conflict(f"rule {rule_id!r} is already rejected")
    return store.set_rule_status(session, row, RuleStatus.REJECTED, actor=actor, note=reason)


def _note(text: str | None, *, required: bool) -> str:
    text = (text or "").strip()
    if required and not text:
        raise Unprocessable("a reason is required to reject a rule")
    if len(text) > MAX_NOTE_CHARS:
        raise Unprocessable(f"the note has {len(text)} characters, more than {MAX_NOTE_CHARS}")
    return text


def check_scope(scope: Any) -> str:
    if not isinstance(scope, str) or not SCOPE_RE.fullmatch(scope):
        raise Unprocessable(f"scope must be 'global', 'framework:<name>' or 'family:<name>', got {shown(scope)}")
    return scope


# -- the reviewer --------------------------------------------------------------------------------
@dataclass
class ValidationFailed:
    rule_id: str
    validation: Validation

    @property
    def message(self) -> str:
        failed = [c for c in self.validation.checks if not c.ok]
        return "; ".join(f"{c.name}: {c.detail}" for c in failed) or "invalid"

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.rule_id, "error": self.message, "checks": self.validation.to_dict()}


class Review:
    """What validation and dry-runs need, built once per process: the validator (error
    corpus, held-out sample, the built-in rules' examples) and the built-in rules."""

    def __init__(self, rulebook: Rulebook, *, metrics: Any = None):
        self.rulebook = rulebook
        self.metrics = metrics
        self._validator: Validator | None = None
        self._lock = threading.Lock()

    def validator(self) -> Validator:
        with self._lock:
            if self._validator is None:
                rb = self.rulebook
                self._validator = Validator(
                    guard=rb.guard, corpus=load_error_corpus(),
                    held_out=[*HELD_OUT_HEALTHY, *(e for r in rb.builtin_filters for e in r.examples)],
                    evidence=[e for r in rb.builtin_diagnosis for e in r.examples], min_support=1)
            return self._validator

    def _rejected(self, origin: str, validation: Validation) -> None:
        if self.metrics is not None:
            self.metrics.validation_rejected(origin, validation.failed)

    # -- validation ------------------------------------------------------------------------
    def validate_filter(self, pattern: str, examples: list[str], errors: list[str]) -> Validation:
        return self.validator().validate(pattern, segment=examples, claims=range(len(examples)), errors=errors)

    def validate(self, fields: dict[str, Any], errors: list[str]) -> Validation:
        """Validate a rule given as row fields plus `examples` (and `counter_examples`)."""
        examples = list(fields.get("examples") or [])
        if fields["kind"] == RuleKind.FILTER:
            if not examples:
                return Validation(fields["pattern"], (_no_examples(),))
            return self.validate_filter(fields["pattern"], examples, errors)
        rule = diagnosis_from_fields(fields)
        return validate_diagnosis_rule(rule, examples=examples, counter_examples=fields.get("counter_examples") or ())

    # -- edit --------------------------------------------------------------------------------
    def edit(self, session: Session, rule_id: str, changes: dict[str, Any], *, actor: str) -> RuleRow:
        """Change a rule's pattern, description, scope (and a diagnosis rule's reason, tier,
        ...). The result is validated like a new rule; a failure is a 422 naming the check."""
        row = require_rule(session, rule_id)
        changes = {k: v for k, v in changes.items() if v is not None}
        allowed = FILTER_FIELDS if row.kind == RuleKind.FILTER else DIAGNOSIS_FIELDS
        unknown = sorted(set(changes) - allowed)
        if unknown:
            raise Unprocessable(f"cannot edit {', '.join(unknown)} of a {row.kind} rule "
                                f"(editable: {', '.join(sorted(allowed))})")
        if not changes:
            raise Unprocessable("nothing to change: give pattern, description or scope")
        fields = row_fields(row)
        fields["examples"] = examples_of(row)
        fields["counter_examples"] = list((row.provenance or {}).get("counter_examples") or [])
        if row.kind == RuleKind.DIAGNOSIS and "pattern" in changes and "patterns" not in changes:
            changes["patterns"] = [changes.pop("pattern")]
        for key, value in changes.items():
            fields[key] = _clean_field(key, value)
        if row.kind == RuleKind.DIAGNOSIS:
            fields["pattern"] = fields["patterns"][0] if fields["patterns"] else ""
        check_scope(fields["scope"])
        validation = self.validate(fields, store.error_lines(session, limit=STORED_ERROR_LINES))
        if not validation.ok:
            self._rejected("admin_edit", validation)
            failed = ValidationFailed(rule_id, validation)
            raise Unprocessable(f"the edited rule is not valid: {failed.message}", checks=validation.to_dict())
        provenance = dict(row.provenance or {})
        provenance.update(evidence=fields["examples"], validation=validation.to_dict())
        if fields.get("counter_examples"):
            provenance["counter_examples"] = fields["counter_examples"]
        update = {k: fields[k] for k in CONTENT_FIELDS if k != "kind" and fields.get(k) != getattr(row, k)}
        update["provenance"] = provenance
        return store.edit_rule(session, row, update, actor=actor)

    # -- dry-run -------------------------------------------------------------------------------
    def dry_run(self, session: Session, rule_id: str, changes: dict[str, Any] | None = None, *,
                jobs: int = DRY_RUN_JOBS, actor: str = "") -> dict[str, Any]:
        """Replay the stored jobs' kept lines with the rules in force, without and with this
        rule (as stored, or with `changes` to its pattern or scope): which jobs it matches,
        which lines it would drop or explain, and how each diagnosis would change."""
        row = require_rule(session, rule_id)
        changes = {k: v for k, v in (changes or {}).items() if v is not None}
        fields = row_fields(row)
        if row.kind == RuleKind.DIAGNOSIS and "pattern" in changes and "patterns" not in changes:
            changes["patterns"] = [changes.pop("pattern")]
        unknown = sorted(set(changes) - {"pattern", "patterns", "scope"})
        if unknown:
            raise Unprocessable(f"a dry-run may change pattern, patterns or scope, not {', '.join(unknown)}")
        for key, value in changes.items():
            fields[key] = _clean_field(key, value)
        check_scope(fields["scope"])
        jobs = max(1, min(int(jobs), DRY_RUN_MAX_JOBS))

        filters, diagnosis = store.RuleStore.rows_to_rules(store.active_rows(session))
        filters = [r for r in filters if r.id != row.id]
        diagnosis = [r for r in diagnosis if r.id != row.id]
        try:
            if row.kind == RuleKind.FILTER:
                candidate: FilterRule | DiagnosisRule = FilterRule(
                    id=row.id, pattern=fields["pattern"], description=fields["description"], scope=fields["scope"],
                    source=row.source, trusted=False)
                FilterProgram([candidate], self.rulebook.guard)  # compiles now, or says why not
                before, after = self._rulebook(filters, diagnosis), self._rulebook([*filters, candidate], diagnosis)
            else:
                candidate = diagnosis_from_fields({**fields, "id": row.id, "source": row.source})
                before, after = self._rulebook(filters, diagnosis), self._rulebook(filters, [*diagnosis, candidate])
        except (FilterCompileError, DiagnosisCompileError, ValueError) as exc:
            raise Unprocessable(f"the rule does not compile: {exc}") from None

        report: list[dict[str, Any]] = []
        scanned = lines_scanned = 0
        for job in store.find_jobs(session, limit=jobs):
            kept = store.kept_lines(session, job.id)
            if not kept:
                continue
            scanned += 1
            lines_scanned += len(kept)
            entry = _compare(job, kept, before, after, candidate)
            if entry["matched_lines"] or entry["changed"]:
                report.append(entry)
        store.audit(session, actor or "system", "rule.dry_run", row.id, changes=sorted(changes),
                    jobs_scanned=scanned, matched_jobs=sum(1 for e in report if e["matched_lines"]),
                    changed_jobs=sum(1 for e in report if e["changed"]))
        return {
            "rule": {"id": row.id, "kind": row.kind, "status": row.status, "scope": fields["scope"],
                     "pattern": fields["pattern"], "patterns": fields.get("patterns") or None,
                     "changed": sorted(changes)},
            "jobs_scanned": scanned, "lines_scanned": lines_scanned,
            "matched_jobs": sum(1 for e in report if e["matched_lines"]),
            "changed_jobs": sum(1 for e in report if e["changed"]),
            "jobs": report,
        }

    def _rulebook(self, filters: list[FilterRule], diagnosis: list[DiagnosisRule]) -> Rulebook:
        return Rulebook(source=_StaticRules(filters, diagnosis), guard=self.rulebook.guard,
                        builtin_filters=self.rulebook.builtin_filters,
                        builtin_diagnosis=self.rulebook.builtin_diagnosis)

    # -- rule packs --------------------------------------------------------------------------------
    def import_pack(self, session: Session, text: str, *, actor: str, status: str = RuleStatus.PENDING.value,
                    on_conflict: str = "skip") -> dict[str, Any]:
        """Import a YAML rule pack (the rules/packs format, or an export). Every rule is
        validated first and nothing is stored unless all are valid. A rule whose id is
        stored already is `unchanged` when its content is the same; otherwise `on_conflict`
        says: `skip` (keep the stored one), `replace` (a new version of it) or `fail` (409)."""
        if status not in (RuleStatus.PENDING, RuleStatus.ACTIVE):
            raise Unprocessable(f"imported rules are pending or active, not {shown(status)}")
        if on_conflict not in ("skip", "replace", "fail"):
            raise Unprocessable(f"on_conflict must be skip, replace or fail, not {shown(on_conflict)}")
        items = parse_pack(text)
        builtin_ids = {r.id for r in self.rulebook.builtin_filters} | {r.id for r in self.rulebook.builtin_diagnosis}
        errors = store.error_lines(session, limit=STORED_ERROR_LINES)
        invalid: list[dict[str, Any]] = []
        plan: list[tuple[dict[str, Any], RuleRow | None]] = []
        for fields in items:
            if fields["id"] in builtin_ids:
                invalid.append({"id": fields["id"], "error": "the id of a built-in rule"})
                continue
            validation = self.validate(fields, errors)
            if not validation.ok:
                self._rejected("import", validation)
                invalid.append(ValidationFailed(fields["id"], validation).to_dict())
                continue
            fields["validation"] = validation.to_dict()
            plan.append((fields, store.get_rule(session, fields["id"])))
        if invalid:
            raise Unprocessable(f"{len(invalid)} of the {len(items)} rules are not valid, nothing was imported: "
                                + "; ".join(f"{i['id']}: {i['error']}" for i in invalid[:5]), invalid=invalid)
        conflicts = [f["id"] for f, row in plan if row is not None and not same_content(f, row)]
        if conflicts and on_conflict == "fail":
            raise Conflict(f"{len(conflicts)} rule(s) exist with other content: {', '.join(conflicts[:10])}",
                           conflicts=conflicts)
        result: dict[str, list[str]] = {"created": [], "activated": [], "replaced": [], "unchanged": [],
                                        "skipped": []}
        for fields, row in plan:
            provenance = {"evidence": fields["examples"], "validation": fields["validation"],
                          "imported": {"by": actor, "at": datetime.now(UTC).isoformat(),
                                       "source": fields["original_source"]}}
            if fields.get("counter_examples"):
                provenance["counter_examples"] = fields["counter_examples"]
            content = {k: fields[k] for k in CONTENT_FIELDS if k != "kind"}
            if row is None:
                store.add_rule(session, actor=actor, id=fields["id"], kind=fields["kind"], status=status,
                               source="import", provenance=provenance, **content)
                result["created"].append(fields["id"])
            elif same_content(fields, row):
                if status == RuleStatus.ACTIVE and row.status == RuleStatus.PENDING:
                    # the same rule was suggested here too: the import is its approval
                    store.set_rule_status(session, row, RuleStatus.ACTIVE, actor=actor, note="imported")
                    result["activated"].append(fields["id"])
                else:  # a person's rejection here stands
                    result["unchanged"].append(fields["id"])
            elif on_conflict == "replace":
                store.edit_rule(session, row, {**content, "provenance": {**(row.provenance or {}), **provenance}},
                                actor=actor)
                result["replaced"].append(fields["id"])
            else:
                result["skipped"].append(fields["id"])
        store.audit(session, actor, "rules.import", "", status=status, on_conflict=on_conflict,
                    **{k: len(v) for k, v in result.items()})
        return {"status": status, **result}


class _StaticRules:
    def __init__(self, filters: list[FilterRule], diagnosis: list[DiagnosisRule]):
        self._rules = (filters, diagnosis)

    def active_rules(self) -> tuple[list[FilterRule], list[DiagnosisRule]]:
        return self._rules

    def version(self) -> int:
        return 0


def _no_examples():
    from agents.validation import Check

    return Check("claims", False, "no example line: give at least one line the rule must match")


# -- fields ------------------------------------------------------------------------------------
def row_fields(row: RuleRow) -> dict[str, Any]:
    data = {k: getattr(row, k) for k in CONTENT_FIELDS}
    data["patterns"] = list(row.patterns or ([row.pattern] if row.kind == RuleKind.DIAGNOSIS else []))
    data["description"] = row.description or ""
    data["mitigation"] = row.mitigation or ""
    return data


def same_content(fields: dict[str, Any], row: RuleRow) -> bool:
    stored = row_fields(row)
    return all((fields.get(k) or None) == (stored.get(k) or None) for k in CONTENT_FIELDS)


def _clean_field(key: str, value: Any) -> Any:
    if key in ("examples", "counter_examples", "patterns"):
        if isinstance(value, str) or not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise Unprocessable(f"{key} must be a list of strings")
        if key == "patterns" and not value:
            raise Unprocessable("patterns must not be empty")
        return list(value)
    if not isinstance(value, str):
        raise Unprocessable(f"{key} must be a string")
    if key == "reason" and not is_reason(value):
        raise Unprocessable(f"unknown reason {shown(value)} (see the taxonomy)")
    for name, enum in (("tier", Tier), ("origin", Origin), ("action", Action)):
        if key == name and value not in {e.value for e in enum}:
            raise Unprocessable(f"{name} must be one of {', '.join(e.value for e in enum)}, not {shown(value)}")
    return value.strip() if key in ("description", "mitigation", "scope") else value


def diagnosis_from_fields(fields: dict[str, Any]) -> DiagnosisRule:
    try:
        return DiagnosisRule(
            id=fields.get("id") or "candidate", reason=fields["reason"] or "unknown",
            tier=Tier(fields.get("tier") or "cause"), patterns=tuple(fields.get("patterns") or [fields["pattern"]]),
            origin=Origin(fields.get("origin") or "unknown"), action=Action(fields.get("action") or "investigate"),
            mitigation=fields.get("mitigation") or "", description=fields.get("description") or "",
            scope=fields.get("scope") or "global", source=fields.get("source") or "import")
    except ValueError as exc:
        raise Unprocessable(f"invalid diagnosis rule: {exc}") from None


# -- dry-run replay ------------------------------------------------------------------------------
def _replay(rulebook: Rulebook, job: Job, kept: list[KeptLine]) -> tuple[JobRun, dict[str, Any], dict[str, list[int]]]:
    """Diagnose a job again from its kept lines (no agent); returns the run, the diagnosis
    and, per source, the original line number of each line fed."""
    meta = JobMeta(name=job.name or "", framework=job.framework, tags=tuple(job.tags or ()))
    run = JobRun(rulebook, meta)
    run.feed_kept(kept)
    numbers: dict[str, list[int]] = {}
    for line in kept:
        numbers.setdefault(line.source, []).append(line.line_number)
    return run, run.finish().to_dict(), numbers


def _original(numbers: dict[str, list[int]], source: str, number: int) -> int:
    found = numbers.get(source) or []
    return found[number - 1] if 0 < number <= len(found) else number


def _verdict(diagnosis: dict[str, Any], numbers: dict[str, list[int]]) -> dict[str, Any]:
    root = diagnosis.get("root_cause") or {}
    return {"status": diagnosis["status"], "reason": root.get("reason"), "origin": root.get("origin"),
            "source": root.get("source"), "line": root.get("line"),
            "line_number": _original(numbers, root.get("file") or "", root.get("line_number") or 0) if root else None,
            "action": diagnosis.get("action")}


def _compare(job: Job, kept: list[KeptLine], before: Rulebook, after: Rulebook,
             candidate: FilterRule | DiagnosisRule) -> dict[str, Any]:
    run_a, diag_a, numbers = _replay(before, job, kept)
    run_b, diag_b, _ = _replay(after, job, kept)
    if isinstance(candidate, FilterRule):
        matched = sum(s.stream.rule_stats().get(candidate.id).count for s in run_b.sources.values()
                      if candidate.id in s.stream.rule_stats())
        still = {(k.source, k.line_number) for k in run_b.compressed.lines()}
        sample = [k.text for k in run_a.compressed.lines() if (k.source, k.line_number) not in still][:SAMPLE_LINES]
    else:
        found = run_b.classifier.found.get(candidate.id)
        matched = found.count if found else 0
        sample = [e.line for e in found.items[:SAMPLE_LINES]] if found else []
    a, b = _verdict(diag_a, numbers), _verdict(diag_b, numbers)
    changed = any(a[k] != b[k] for k in ("status", "reason", "source", "line"))
    return {
        "job_id": job.id, "name": job.name, "family": job.family, "framework": job.framework,
        "created_at": job.created_at.isoformat() if job.created_at else None,
        "stored": {"status": job.status, "reason": job.reason},
        "matched_lines": matched, "sample": sample,
        "lines_kept": {"stored": len(kept), "before": diag_a["compression"]["lines_kept"],
                       "after": diag_b["compression"]["lines_kept"]},
        "before": a, "after": b, "changed": changed,
    }


# -- rule packs ------------------------------------------------------------------------------------
def export_pack(session: Session, *, kind: str | None = None, status: str | None = RuleStatus.ACTIVE.value,
                scope: str | None = None, actor: str = "") -> tuple[str, int]:
    """The stored rules as a YAML rule pack (rules/packs format: a mapping with a `rules`
    list; each rule carries its kind and scope, and its evidence as `examples`)."""
    kind = RuleKind(kind).value if kind else None
    status = RuleStatus(status).value if status else None
    rows: list[RuleRow] = []
    offset = 0
    while True:
        page, total = store.list_rules(session, kind=kind, status=status, scope=scope, limit=1000, offset=offset)
        rows += page
        offset += len(page)
        if not page or offset >= total:
            break
    rows.sort(key=lambda r: (r.kind, r.scope, r.id))
    items = [pack_item(row) for row in rows]
    doc = {"format": PACK_FORMAT, "exported_at": datetime.now(UTC).isoformat(timespec="seconds"),
           "filter": {k: v for k, v in (("kind", kind), ("status", status), ("scope", scope)) if v},
           "rules": items}
    if actor:
        store.audit(session, actor, "rules.export", "", rules=len(items), kind=kind, status=status, scope=scope)
    header = ("# Faultline rule pack. Import with `faultline rules import FILE` or\n"
              "# POST /admin/rules/import; every rule is validated again on import.\n")
    return header + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=100_000), len(items)


def pack_item(row: RuleRow) -> dict[str, Any]:
    p = row.provenance or {}
    item: dict[str, Any] = {"id": row.id, "kind": row.kind, "scope": row.scope}
    if row.kind == RuleKind.DIAGNOSIS:
        item.update(reason=row.reason, tier=row.tier, patterns=list(row.patterns or [row.pattern]),
                    origin=row.origin, action=row.action)
        if row.mitigation:
            item["mitigation"] = row.mitigation
    else:
        item["pattern"] = row.pattern
    if row.description:
        item["description"] = row.description
    item["examples"] = examples_of(row)
    if p.get("counter_examples"):
        item["counter_examples"] = list(p["counter_examples"])
    item["source"] = row.source
    item["status"] = row.status
    return item


class PackLoader(StrictLoader):
    """A safe loader that refuses anchors' aliases (`*name`): a rule pack has no use for
    them, and nested ones (a "billion laughs") make a few hundred bytes into gigabytes
    as soon as anything walks or prints the result; and, as every pack, a key given twice."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(None, None, "a rule pack may not use YAML aliases (*name)",
                                              self.peek_event().start_mark)
        return super().compose_node(parent, index)


def parse_pack(text: str) -> list[dict[str, Any]]:
    """The rules of a YAML pack as row fields (plus `examples`), or a 422 saying what is wrong
    (the pack schema's checks, rules.pack_schema, then the ids and scopes the store allows)."""
    try:
        data = yaml.load(text, Loader=PackLoader)  # noqa: S506 - a SafeLoader without aliases
    except yaml.YAMLError as exc:
        raise Unprocessable(f"not valid YAML: {str(exc)[:300]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        raise Unprocessable("a rule pack is a YAML mapping with a 'rules' list")
    if len(data["rules"]) > MAX_PACK_RULES:
        raise Unprocessable(f"{len(data['rules'])} rules, more than {MAX_PACK_RULES} in one pack")
    try:
        pack = Pack.model_validate(data)
    except ValidationError as exc:
        found = pack_problems(exc, data)
        raise Unprocessable("invalid rule pack, nothing was imported: " + "; ".join(found[:10]),
                            problems=found) from None
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    problems: list[str] = []
    for index, spec in enumerate(pack.rules):
        try:
            fields = _pack_fields(spec, pack.scope)
        except (PackError, Unprocessable) as exc:
            problems.append(f"rule {index + 1}: {exc}")
            continue
        if fields["id"] in seen:
            problems.append(f"rule {index + 1}: duplicate id {fields['id']!r} in the pack")
            continue
        seen.add(fields["id"])
        out.append(fields)
    if problems:
        raise Unprocessable("invalid rule pack, nothing was imported: " + "; ".join(problems[:10]),
                            problems=problems)
    return out


def _pack_fields(spec: FilterRuleSpec | DiagnosisRuleSpec, default_scope: str) -> dict[str, Any]:
    if spec.id in RESERVED_IDS:
        raise Unprocessable(f"id {spec.id!r} is reserved (a path of the admin API): choose another")
    scope = check_scope(spec.scope or default_scope)
    if isinstance(spec, FilterRuleSpec):
        rule = filter_rule_from_spec(spec, scope=scope, trusted=False)
        fields = {"kind": RuleKind.FILTER.value, "pattern": rule.pattern, "patterns": [], "reason": None,
                  "tier": None, "origin": None, "action": None, "mitigation": ""}
    else:
        rule = diagnosis_rule_from_spec(spec, scope=scope)
        fields = {"kind": RuleKind.DIAGNOSIS.value, "pattern": rule.patterns[0], "patterns": list(rule.patterns),
                  "reason": rule.reason, "tier": rule.tier.value, "origin": rule.origin.value,
                  "action": rule.action.value, "mitigation": rule.mitigation}
    fields.update(id=spec.id, scope=scope, description=rule.description, examples=list(spec.example_lines()),
                  counter_examples=list(spec.counter_examples), original_source=spec.source or "")
    return fields


def status_counts(session: Session) -> dict[str, dict[str, int]]:
    from sqlalchemy import func, select

    out: dict[str, dict[str, int]] = {}
    for kind, status, count in session.execute(select(RuleRow.kind, RuleRow.status, func.count())
                                               .group_by(RuleRow.kind, RuleRow.status)):
        out.setdefault(kind, {})[status] = count
    return out

