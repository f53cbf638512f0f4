"""What a chat template's bounded rendering costs (vit.explain.language.chat_template): a fresh ``python -I`` per
rendering (how it was rendered before) against a child forked from the fork server that imported transformers once
(vit.core.forkserver), side by side on the same machine, the same child code and job.

    python bench/bench_chat_template_server.py --renders 20 --rounds 3 \
        --out bench/results/cpu-2026-11-28/chat-template-server.txt

CPU: the fresh interpreters' (this process's children's rusage) against the server's and its children's
(``/proc/PID/stat``: utime, stime, cutime, cstime), per rendering; the server's own start (its imports, once per
process that renders) is given apart.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TEMPLATE = ("{% for message in messages %}{{ message['role'] }}: {% for part in message['content'] %}"
            "{% if part['type'] == 'image' %}<image>{% else %}{{ part['text'] }}{% endif %} {% endfor %}"
            "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")
TICK = os.sysconf("SC_CLK_TCK")


def job(i: int) -> str:
    """The job ``chat_template._rendered`` gives its child, for question ``i``."""
    from vit.explain.language import chat_template as ct

    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"question {i}"}]}]
    return json.dumps({"template": TEMPLATE, "messages": messages, "kwargs": {}, "memory": ct.TEMPLATE_MEMORY_BYTES,
                       "chars": ct.MAX_PROMPT_CHARS, "seconds": ct.TEMPLATE_SECONDS})


def children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def server_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / TICK


def fresh(renders: int) -> tuple[float, float]:
    """CPU and wall seconds per rendering, a fresh interpreter each."""
    from vit.explain.language import chat_template

    env = {**os.environ, **chat_template._server.env}  # the server's environment, as the child had it
    cpu, began = children_cpu(), time.perf_counter()
    for i in range(renders):
        done = subprocess.run([sys.executable, "-I", "-c", chat_template._CHILD], input=job(i), text=True,
                              capture_output=True, env=env, check=True)
        assert "text" in json.loads(done.stdout), done.stdout
    return (children_cpu() - cpu) / renders, (time.perf_counter() - began) / renders


def forked(renders: int) -> tuple[float, float, float]:
    """CPU and wall seconds per rendering through a new fork server, and the CPU of the server's start."""
    from vit.core.forkserver import ForkServer
    from vit.explain.language import chat_template

    server = ForkServer(chat_template._IMPORTS, isolated=True, env=chat_template._server.env)  # the product's, new
    try:
        server.run("pass", timeout=300)  # started: its imports
        pid = server._process.pid
        start = server_cpu(pid)
        began = time.perf_counter()
        for i in range(renders):
            done = server.run(chat_template._CHILD, stdin=job(i), timeout=300)
            assert "text" in json.loads(done.stdout), done.stdout
        per_cpu = (server_cpu(pid) - start) / renders
        return per_cpu, (time.perf_counter() - began) / renders, start
    finally:
        server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--renders", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rows = {"fresh": [], "forked": []}
    starts = []
    for i in range(args.rounds):
        for name in (("fresh", "forked") if i % 2 == 0 else ("forked", "fresh")):
            if name == "fresh":
                rows[name].append(fresh(args.renders))
            else:
                cpu, wall, start = forked(args.renders)
                rows[name].append((cpu, wall))
                starts.append(start)
    cpu = {name: statistics.median(r[0] for r in found) for name, found in rows.items()}
    wall = {name: statistics.median(r[1] for r in found) for name, found in rows.items()}
    lines = [f"# python bench/bench_chat_template_server.py --renders {args.renders} --rounds {args.rounds}",
             f"# {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the end; per rendering of a "
             "one-line template, medians of the rounds", "",
             "| rendered by | CPU s per rendering | wall s per rendering | by round (CPU s) |", "|---|---:|---:|---|"]
    for name, label in (("fresh", "a fresh `python -I` each (before)"), ("forked", "a fork of the server (now)")):
        lines.append(f"| {label} | {cpu[name]:.3f} | {wall[name]:.3f} | "
                     f"{', '.join(f'{r[0]:.3f}' for r in rows[name])} |")
    lines += ["", f"The server's start (its imports, once per process that renders): {statistics.median(starts):.2f} s "
              f"of CPU. Ratio of CPU per rendering, fresh / forked: {cpu['fresh'] / cpu['forked']:.0f}x."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
