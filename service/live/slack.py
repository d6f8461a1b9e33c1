"""The chat message of a notification, for Slack's incoming webhooks (Mattermost and
Rocket.Chat take the same `{"text": ...}` body).

People read it, so it says what a person acts on: the job, what happened (reason, origin),
what to do (action, nodes), the line that shows it and a link to the job's page. The line
comes from a log, untrusted text: Slack's three control characters are escaped, so a line
cannot mention `<!channel>`, a user, or dress a link.
"""

from __future__ import annotations

from typing import Any

MAX_LINE_CHARS = 300


def escape(text: str) -> str:
    """Slack's mrkdwn escaping (&, <, >), which also disarms mentions and links."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def message(payload: dict[str, Any], public_url: str = "") -> dict[str, str]:
    """The `{"text": ...}` body for a notification payload (service.live.notify.payload)."""
    job = payload.get("job") or {}
    root = payload.get("root_cause") or {}
    name = escape(str(job.get("name") or job.get("id") or "a job"))
    what = {"failed": "failed", "stalled": "stalled", "loss_spike": "has a loss spike"}.get(payload.get("event"), "changed")
    head = f"*{name}* {what}"
    if payload.get("reason"):
        head += f": `{escape(payload['reason'])}` ({escape(str(payload.get('origin') or 'unknown'))})"
    if payload.get("final"):
        head += f", exit code {job.get('exit_code')}" if job.get("exit_code") is not None else ", ended"
    lines = [head]
    action = payload.get("action")
    if action and action != "none":
        nodes = payload.get("suspect_nodes") or []
        lines.append(f"action: `{escape(action)}`" + (f" on {escape(', '.join(nodes))}" if nodes else ""))
    line = root.get("line")
    if line:
        where = f"line {root['line_number']}" if root.get("line_number") else "line"
        if root.get("file"):
            where += f" of {escape(str(root['file']))}"
        shown = line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + "…"
        lines.append(f"{where}:\n> {escape(shown)}")
    if public_url and job.get("id"):
        lines.append(f"<{public_url.rstrip('/')}/admin/job/{job['id']}|job page>")
    return {"text": "\n".join(lines)}
