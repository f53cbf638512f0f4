"""A VLM's chat template rendered under a time and a size bound (issue 95, item 2).

The template is the folder's own code. transformers renders it in jinja's sandbox, which stops a template from
reaching Python but not from working without end: ``{{ 'x' * 10**10 }}`` built a 4 GB string that killed the
server, and three nested ``range(100000)`` loops (the sandbox's limit is per range) held a core without an answer.
So the template is rendered by transformers' own ``render_jinja_template`` (the prompt is the one
``processor.apply_chat_template`` gives) in a child process whose address space is bounded
(``TEMPLATE_MEMORY_BYTES`` past what its imports take), whose CPU time is bounded (``TEMPLATE_SECONDS``: a template's
own work, which a busy machine does not lengthen; a wall clock of 20 s once refused a correct template while two test
runs kept the cores busy, the child still importing), killed past ``TEMPLATE_WALL_SECONDS`` of waiting all the same,
and whose prompt is refused past ``MAX_PROMPT_CHARS``. Each child is forked from one server that imported
transformers once (``vit.core.forkserver``): a fresh interpreter took 1.55 s of CPU per rendering, a fork 0.03
(bench/results/cpu-2026-11-28/chat-template-server.txt), at every new question. A rendering (or its refusal) is kept
per template, conversation and day (a template may write the date), so a question asked again (the explorer prepares
it at each rerun) costs no child; a rendering stopped by the wall clock is not kept (a busy machine slowed the child).
"""

from __future__ import annotations

import hashlib
import json
import math
import signal
import subprocess
import threading
import time
from collections import OrderedDict

from vit.core.forkserver import ForkServer, ForkServerError

KEPT = 64  # renderings kept: each at most MAX_PROMPT_CHARS, keyed by the template's digest (a template may be MBs)
MAX_PROMPT_CHARS = 100_000  # the question is at most 2,000; published templates add a system prompt of a few kB
TEMPLATE_SECONDS = 20  # of the child's CPU: a prompt renders in ms
TEMPLATE_WALL_SECONDS = 300  # of waiting for a child; the first waits for the server's imports (~1.5 s; 20+ at load 20)
TEMPLATE_MEMORY_BYTES = 256 * 2**20  # past the child's imports: a prompt of MAX_PROMPT_CHARS is a few MB

# The server's imports, once; the child: reads the job, bounds its own address space past those imports and its own
# CPU time (a forked child's starts at 0), renders, answers in one JSON line.
_IMPORTS = "from transformers.utils.chat_template_utils import render_jinja_template"
_CHILD = "import json, resource, sys\n" + _IMPORTS + r"""
job = json.loads(sys.stdin.read())
try:
    with open("/proc/self/statm") as f:
        used = int(f.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (used + job["memory"], used + job["memory"]))
except (OSError, ValueError):
    pass
spent = resource.getrusage(resource.RUSAGE_SELF)
cpu = int(spent.ru_utime + spent.ru_stime) + 1 + job["seconds"]  # whole seconds: SIGXCPU there, SIGKILL 1 s after
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
try:
    [text], _ = render_jinja_template(conversations=[job["messages"]], chat_template=job["template"],
                                      add_generation_prompt=True, **job["kwargs"])
    answer = {"chars": len(text)} if len(text) > job["chars"] else {"text": text}
except MemoryError:
    answer = {"memory": True}
except Exception as e:
    lines = str(e).strip().splitlines()
    answer = {"error": type(e).__name__ + (": " + lines[0][:200] if lines else "")}
sys.stdout.write(json.dumps(answer))
"""


class ChatTemplateError(ValueError):
    """A chat template that fails, or works past its bounds; the message says which, in one line."""


def folder_template(processor) -> str | dict | None:
    """The chat template the processor's folder states: the processor's own, else, where the processor's class takes
    none (its ``__init__`` has no ``chat_template``: Chameleon's), its tokenizer's, which is where transformers puts
    the folder's ``chat_template.jinja`` then; None where it states none."""
    import inspect

    own = getattr(processor, "chat_template", None)
    if own or getattr(processor, "tokenizer", None) is None:
        return own or None
    try:
        parameters = inspect.signature(type(processor).__init__).parameters
    except (TypeError, ValueError):
        return None
    if "chat_template" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return None  # a class that keeps its template: the folder states none
    return getattr(processor.tokenizer, "chat_template", None) or None


def render(processor, messages: list[dict]) -> str:
    """``processor.apply_chat_template(messages, add_generation_prompt=True)`` (with the folder's template,
    ``folder_template``), rendered in a bounded child: ChatTemplateError (one line) for a template that fails, runs
    past ``TEMPLATE_SECONDS``, takes more than ``TEMPLATE_MEMORY_BYTES`` or gives a prompt of more than
    ``MAX_PROMPT_CHARS``."""
    template = folder_template(processor)
    if isinstance(template, dict):  # several named templates: the processor's "default", as transformers reads it
        template = template.get("default")
    if _has_video(messages):
        template = _video_template(processor) or template
    if not isinstance(template, str):
        raise ChatTemplateError("the processor has no chat template to render")
    kwargs = json.dumps(processor.tokenizer.special_tokens_map, default=str, sort_keys=True)
    conversation = json.dumps(messages, sort_keys=True)
    key = (hashlib.sha256(template.encode("utf-8", "surrogatepass")).hexdigest(), conversation, kwargs,
           time.strftime("%Y-%m-%d"))
    with _lock:
        kept = _kept.get(key)
        if kept is not None:
            _kept.move_to_end(key)
    if kept is None:
        kept = _rendered(template, conversation, kwargs)
        if kept[0] != "late":
            with _lock:
                _kept[key] = kept
                while len(_kept) > KEPT:
                    _kept.popitem(last=False)
    outcome, text = kept
    if outcome != "text":
        raise ChatTemplateError(text)
    return text


_server = ForkServer(_IMPORTS, isolated=True, env={
    "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_OFFLINE": "1"})
_kept: OrderedDict[tuple, tuple[str, str]] = OrderedDict()  # the renderings kept, least recently used first
_lock = threading.Lock()  # the explorer's sessions render from their own threads


def clip_inputs(processor, prompt: str, run=None, **kwargs):
    """``processor(text=prompt, **kwargs)`` (or ``run(text=prompt, **kwargs)``: a call that wraps the processor) for a
    clip (``videos=`` among ``kwargs``): ChatTemplateError (one line) in place of transformers' count of video tokens
    ("The total number of <|video_pad|> tokens ...") where the model's chat template wrote nothing for the clip (it
    has no video entry: ``prompt`` holds no video token)."""
    try:
        return (run or processor)(text=prompt, **kwargs)
    except ValueError:
        token = getattr(processor, "video_token", None)
        if isinstance(token, str) and token and token not in prompt:
            raise ChatTemplateError(f"this model's chat template cannot take a clip: it writes nothing for a video "
                                    f"(no {token} in its prompt); ask about images instead") from None
        raise


def _has_video(messages: list[dict]) -> bool:
    return any(isinstance(part, dict) and part.get("type") == "video" for message in messages
               for part in (message.get("content") or []) if not isinstance(message.get("content"), str))


def _video_template(processor) -> str | None:
    """The template a processor's own ``apply_chat_template`` renders a conversation with a video through in place
    of the folder's: SmolVLM's (``SmolVLMProcessor.apply_chat_template`` takes its module's ``DEFAULT_CHAT_TEMPLATE``,
    "the correct default template for BC"), so the prompt is the one transformers gives. None: the folder's."""
    import sys

    module = sys.modules.get(type(processor).__module__)
    default = getattr(module, "DEFAULT_CHAT_TEMPLATE", None)
    overridden = "apply_chat_template" in vars(type(processor))
    return default if overridden and isinstance(default, str) else None


def _rendered(template: str, messages: str, kwargs: str) -> tuple[str, str]:
    """``("text", prompt)``, ``("refused", why)`` or ``("late", why)``: the child's rendering of ``template`` (JSON
    ``messages`` and special tokens ``kwargs``)."""
    job = json.dumps({"template": template, "messages": json.loads(messages), "kwargs": json.loads(kwargs),
                      "memory": TEMPLATE_MEMORY_BYTES, "chars": MAX_PROMPT_CHARS,
                      "seconds": math.ceil(TEMPLATE_SECONDS)})
    try:
        done = _server.run(_CHILD, stdin=job, timeout=TEMPLATE_WALL_SECONDS)
    except ForkServerError:  # not the template's doing (the server was killed): the next question starts another
        return "late", ("the process that renders chat templates ended before it answered: ask again, or give "
                        "prompt= with the model's image placeholder instead")
    except subprocess.TimeoutExpired:
        return "late", (f"the model's chat template gave no prompt within {TEMPLATE_WALL_SECONDS:g} s (this machine "
                        "may be too busy: ask again; a template renders in milliseconds), or give prompt= with the "
                        "model's image placeholder instead")
    if done.returncode in (-signal.SIGXCPU, -signal.SIGKILL) and not done.stdout:
        return "refused", (f"the model's chat template ran past {TEMPLATE_SECONDS:g} s of CPU without giving a "
                           "prompt (a template renders in milliseconds); fix its chat_template, or give prompt= with "
                           "the model's image placeholder instead")
    try:
        answer = json.loads(done.stdout)
    except ValueError:
        answer = {"error": f"its rendering ended without an answer (exit status {done.returncode})"}
    if "text" in answer:
        return "text", answer["text"]
    if answer.get("memory"):
        why = f"took more than the {TEMPLATE_MEMORY_BYTES // 2**20} MB a template may take"
    elif "chars" in answer:
        why = f"gives a prompt of {answer['chars']:,} characters, more than the {MAX_PROMPT_CHARS:,} allowed"
    else:
        why = f"fails: {answer['error']}"
    return "refused", (f"the model's chat template {why}; fix its chat_template, or give prompt= with the model's "
                       "image placeholder instead")
