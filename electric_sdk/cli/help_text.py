"""What `electric COMMAND --help` says beyond its options: a description and an example for every
command, and "did you mean" for a mistyped one.

The examples live here, in one table, so a test can check that no command lacks one; each
command's module still owns its arguments and their help.
"""

from __future__ import annotations

import argparse
import difflib
import textwrap
from collections.abc import Iterable
from typing import Any

# One or two command lines per command, as a user would type them.
EXAMPLES: dict[str, tuple[str, ...]] = {
    "spawn": ("electric spawn my_agent/agent_1 --grace 30s",),
    "get": ("electric get my_agent/agent_1", "electric get my_agent/agent_1 --json"),
    "ls": ("electric ls --type my_agent --state running,idle --limit 20",),
    "signal": ("electric signal my_agent/agent_1 TERM --reason 'user requested shutdown'",),
    "kill": ("electric kill my_agent/agent_1 --reason stuck",),
    "send": ("electric send my_agent/agent_1 'summarize the thread' --data '{\"priority\": 1}'",),
    "fork": ("electric fork my_agent/agent_1 agent_1b --at 42 --reason 'try the other plan'",),
    "retry": ("electric retry my_agent/agent_1 msg_17 --from-step 3 --reason 'the search API is back'",),
    "events": ("electric events my_agent/agent_1 --from 10 --follow",),
    "state": ("electric state my_agent/agent_1 --watch",),
    "ready": ("electric ready --timeout 30s && electric ls",),
    "wait": ("electric wait my_agent/agent_1 idle stopped --timeout 1m",),
    "workers": ("electric workers", "electric workers --json"),
    "versions": ("electric versions research", "electric versions research --select v1 --reason 'roll back'"),
    "watch": ("electric watch --type my_agent",),
    "run": ("electric run my_agent/agent_1 -m 'hello'",),
    "server": ("electric server --listen 127.0.0.1:7700 --data .electric",),
    "worker": ("electric worker examples.agents:app --address 127.0.0.1:7700",),
    "dev": ("electric dev examples.agents:app",),
    "verify": ("electric verify --data .electric --json",),
    "backup": ("electric backup --data .electric electric-backup.db",),
    "restore": ("electric restore electric-backup.db --data .electric-restored",),
    "export": ("electric export --data .electric streams.jsonl",),
    "import": ("electric import streams.jsonl --data .electric-new",),
    "replay-check": (
        "electric replay-check myapp.agents:app --server 127.0.0.1:7700",
        "electric replay-check myapp.agents:app --file streams.jsonl --all-runs",
    ),
    "mcp": ("electric mcp --address 127.0.0.1:7700",),
    "completion": ("electric completion bash >> ~/.bashrc", "electric completion zsh >> ~/.zshrc"),
}


def finish(sub: argparse._SubParsersAction[Any]) -> None:
    """Give every command a description (its one-line help, as a sentence, unless it has its own)
    and an ``example:`` epilog; an existing epilog is kept above the example."""
    summaries = {action.dest: action.help or "" for action in sub._choices_actions}
    for name, parser in sub.choices.items():
        summary = summaries.get(name, "")
        if not parser.description and summary:
            parser.description = summary[0].upper() + summary[1:] + "."
        examples = EXAMPLES.get(name, ())
        lines = [textwrap.fill(parser.epilog, 88), ""] if parser.epilog else []
        if examples:
            lines += ["example:" if len(examples) == 1 else "examples:", *(f"  $ {e}" for e in examples)]
        parser.epilog = "\n".join(lines) or None
        # The examples are laid out by hand; argparse would rewrap them into one line.
        parser.formatter_class = argparse.RawDescriptionHelpFormatter


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean `spawn`?)`` for the closest command, or nothing when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean `{close[0]}`?)" if close else ""
