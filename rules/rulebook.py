"""The rules in force: built-in packs plus the active learned rules, compiled and cached.

Compiling costs tens of milliseconds (RE2 programs, the Hyperscan guard), so programs are
built once per rule-set version and scope, and shared by every job that uses them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from rules.classifier import DiagnosisProgram
from rules.family import job_family
from rules.filters import FilterProgram, FilterStream, ProgressSink
from rules.guard import ErrorGuard
from rules.model import DiagnosisRule, FilterRule
from rules.builtin import builtin_diagnosis_rules, builtin_filter_rules


class RuleSource(Protocol):
    """Where learned rules live (the database); returns only active ones."""

    def active_rules(self) -> tuple[list[FilterRule], list[DiagnosisRule]]: ...

    def version(self) -> int: ...


FRAMEWORK_PACKS = {
    # stacks built from two others print both's lines (BLOOM's Megatron-DeepSpeed, GPT-NeoX)
    "megatron_deepspeed": frozenset({"megatron_deepspeed", "megatron", "deepspeed"}),
    "gpt_neox": frozenset({"gpt_neox", "megatron", "deepspeed"}),
}


def in_scope(rule: FilterRule, framework: str | None, family: str) -> bool:
    kind, _, value = rule.scope.partition(":")
    if kind == "global":
        return True
    if kind == "framework":
        return framework is None or value in FRAMEWORK_PACKS.get(framework, (framework,))
    if kind == "family":
        return bool(family) and value == family
    return False


class Rulebook:
    def __init__(self, *, source: RuleSource | None = None, guard: ErrorGuard | None = None,
                 builtin_filters: Sequence[FilterRule] | None = None,
                 builtin_diagnosis: Sequence[DiagnosisRule] | None = None):
        self.guard = guard or ErrorGuard()
        self._source = source
        self._builtin_filters = list(builtin_filters if builtin_filters is not None else builtin_filter_rules())
        self._builtin_diagnosis = list(builtin_diagnosis if builtin_diagnosis is not None
                                       else builtin_diagnosis_rules())
        self._lock = threading.Lock()
        self._programs: dict[tuple[str | None, str], FilterProgram] = {}
        self._version = -1
        self.refresh(force=True)

    def refresh(self, *, force: bool = False) -> bool:
        """Reload learned rules if the store's version moved; True when something changed."""
        version = self._source.version() if self._source else 0
        if not force and version == self._version:
            return False
        learned_filters, learned_diagnosis = self._source.active_rules() if self._source else ([], [])
        ids = {r.id for r in self._builtin_filters}
        diagnosis_ids = {r.id for r in self._builtin_diagnosis}
        with self._lock:
            self.filter_rules = self._builtin_filters + [r for r in learned_filters if r.id not in ids]
            self.diagnosis_rules = self._builtin_diagnosis + [r for r in learned_diagnosis
                                                              if r.id not in diagnosis_ids]
            self.diagnosis_program = DiagnosisProgram(self.diagnosis_rules)
            self.completion_rule_ids = frozenset(r.id for r in self.filter_rules if r.event == "completed")
            self._programs.clear()
            self._version = version
        return True

    @property
    def version(self) -> int:
        return self._version

    @property
    def builtin_filters(self) -> list[FilterRule]:
        return list(self._builtin_filters)

    @property
    def builtin_diagnosis(self) -> list[DiagnosisRule]:
        return list(self._builtin_diagnosis)

    def filter_program(self, framework: str | None = None, job_name: str = "", *,
                       family: str | None = None) -> FilterProgram:
        """The rules in force for a job: built-in and learned, of its framework and family
        (`family` overrides the one derived from the job name)."""
        family = job_family(job_name) if family is None else family
        key = (framework, family)
        with self._lock:
            program = self._programs.get(key)
            if program is None:
                rules = [r for r in self.filter_rules if in_scope(r, framework, family)]
                program = self._programs[key] = FilterProgram(rules, self.guard)
            return program

    def extend(self, program: FilterProgram, rules: Sequence[FilterRule]) -> FilterProgram:
        """A program with more rules (learned during a job); not cached."""
        known = {r.id for r in program.rules}
        return FilterProgram([*program.rules, *(r for r in rules if r.id not in known)], self.guard)

    def stream(self, program: FilterProgram, *, source: str = "",
               on_progress: ProgressSink | Callable | None = None) -> FilterStream:
        return FilterStream(program, source=source, on_progress=on_progress)
