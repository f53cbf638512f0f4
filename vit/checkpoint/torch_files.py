"""Torch files on disk: written atomically (``atomic_torch_save``), and checked before anything is unpickled
(``check_archive``: a torch zip archive whose pickle is sized and its opcodes walked) or allocated
(``safetensors_shapes``: a safetensors header read alone). Every torch file this program reads, checkpoints and
imported weights alike, passes here first; ``CheckpointError`` is what any of them raises, in one line.
"""

from __future__ import annotations

import errno
import json
import os
import pickletools
import shutil
import tempfile
import zipfile
from _compat_pickle import IMPORT_MAPPING, NAME_MAPPING  # pickle's own Python 2 renames, as torch applies them
from pathlib import Path

import torch

# Bounds checked before anything is unpickled, so a hostile file costs milliseconds, not minutes.
PICKLE_BASE_BYTES = 3 * 1024 * 1024  # config, class names (ImageNet: 25 KB), metrics (150 KB per 1,000 epochs), a
# long run's loss curve (MAX_STEP_ROWS = 20,000 rows: 1.8 MB); the opcode walk bounds the work within it
PICKLE_BYTES_PER_TENSOR = 512  # a tensor's key and rebuild call take ~150 bytes of pickle
MAX_PICKLE_BYTES = 4 * 1024 * 1024  # the weights-only unpickler reads ~1 MB of opcodes a second
# Dict entries and containers a pickle may build per byte of its size limit: real ones spend 9 or more bytes on each
# (a last.pt with 20,000 step rows: 194,000 in 1.75 MB; timm, torchvision, open_clip, HF weights: 1 per 10-17 bytes)
PICKLE_BYTES_PER_ITEM = 4
MAX_PICKLE_KEY = 2**31  # int keys are an optimizer's parameter indices; ints beyond can be chosen to share a hash
MAX_TENSORS = 16_384  # per file; a whole CLIP or ViT-22B has under 1,000 (a file of a million took 48 s to list)
MAX_SAFETENSORS_HEADER_BYTES = 8 * 2**20  # ~100 bytes a tensor: ViT-B/16's header is 20 kB
MAX_TENSOR_DIMS = 8
SAFETENSORS_DTYPES = {"BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "U16": torch.uint16, "I16": torch.int16,
                      "U32": torch.uint32, "I32": torch.int32, "U64": torch.uint64, "I64": torch.int64,
                      "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
                      "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}
_ZIP_MAGIC = b"PK\x03\x04"
_LEGACY_MAGIC = b"\x80\x02\x8a\x0a"  # torch's pre-1.6 format: a pickled magic number, then pickles
_UMASK = os.umask(0)  # read once at import, before any thread could race on it
os.umask(_UMASK)
_FILE_MODE = 0o666 & ~_UMASK


class CheckpointError(ValueError):
    """A checkpoint that cannot be read; the message says why and what to do."""


class ForeignCheckpointError(CheckpointError):
    """A safe torch file that is not one of ours (e.g. a timm or torchvision state dict): ``vit.sources.open`` reads
    it."""



def atomic_torch_save(payload: object, path: str | os.PathLike) -> Path:
    """``torch.save`` to a temporary file in the same folder, fsync, then rename over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, _FILE_MODE)  # mkstemp makes 0600; checkpoints are ordinary files
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, (OSError, RuntimeError)):
            problem = _write_problem(path, e)
            if problem is not None:
                raise problem from e
        raise
    return path


def _write_problem(path: Path, error: BaseException) -> OSError | None:
    """A full or failing disk as one clear OSError; torch reports it as 'unexpected pos 51840 vs 51728'."""
    os_error = next((e for e in (error, error.__context__, error.__cause__) if isinstance(e, OSError)), None)
    if os_error is None and "unexpected pos" not in str(error) and "write" not in str(error).lower():
        return None  # not a failed write: let it through unchanged
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        free = None
    space = f"{free / 2**20:,.0f} MiB free" if free is not None else "free space unknown"
    if (os_error is not None and os_error.errno in (errno.ENOSPC, errno.EDQUOT)) or (free is not None and
                                                                                   free < 64 * 2**20):
        return OSError(errno.ENOSPC, f"No space left on the disk to write {path} ({space}); free some space, "
                                     "then save again")
    if os_error is not None:
        return OSError(os_error.errno, f"cannot write {path}: {os_error.strerror or os_error} ({space})")
    return OSError(errno.EIO, f"cannot write {path}: the write was cut short ({space}); the disk may be full or "
                              "failing")


def check_archive(path: Path) -> None:
    """Refuse, before unpickling anything, a file that is not a torch zip archive or whose pickle could keep the
    unpickler busy; every torch file this program reads (checkpoints and imported weights) passes here first.

    A bare pickle, or torch's legacy format (pickles), runs to the end of the file and cannot be sized
    beforehand. ``torch.save`` stores every entry uncompressed and writes a pickle (``data.pkl``) of
    ~150 bytes per tensor plus the plain data; a crafted file can pack millions of opcodes into kilobytes
    (compressed) or inflate the pickle far beyond its tensors, which takes minutes to read. Within that size, a
    pickle whose keys share one hash also takes minutes: its opcodes are walked first (``_pickle_problem``).
    """
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise CheckpointError(f"cannot read {path} ({e.strerror or type(e).__name__})") from None
    if magic[:1] == _LEGACY_MAGIC[:1]:  # a pickle's PROTO opcode: torch's pre-1.6 format or a bare pickle
        raise CheckpointError(f"refused to load {path}: it is in torch's legacy (pre-1.6) format or a bare pickle, "
                              "whose pickles could run code or take minutes to read; only torch.save archives "
                              "(torch 1.6 or later) are read")
    if magic != _ZIP_MAGIC:
        raise CheckpointError(f"{path} is not a checkpoint or weights file (not a torch archive)")
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise CheckpointError(f"{path} is truncated or corrupt ({first_line(e)}); re-copy or re-create it") from None
    compressed = next((e.filename for e in entries if e.compress_type != zipfile.ZIP_STORED), None)
    if compressed is not None:
        raise CheckpointError(f"refused to load {path}: its entry {compressed[:80]!r} is compressed, which torch.save "
                              "never does; the file was altered or not written by torch")
    pickles = [e for e in entries if e.filename.endswith("/data.pkl") and e.filename.count("/") == 1]
    tensors = sum(1 for e in entries if e.filename.count("/") == 2 and e.filename.split("/")[1] == "data")
    if tensors > MAX_TENSORS:
        raise CheckpointError(f"refused to load {path}: it holds {tensors:,} tensors, more than the {MAX_TENSORS:,} "
                              "any model this program opens has")
    limit = min(MAX_PICKLE_BYTES, PICKLE_BASE_BYTES + PICKLE_BYTES_PER_TENSOR * tensors)
    for entry in pickles:
        if entry.file_size > limit:
            raise CheckpointError(f"refused to load {path}: its pickle is {entry.file_size:,} bytes for {tensors:,} "
                                  f"tensors (weights need at most {limit:,}); it may be built to stall the reader")
    max_items = limit // PICKLE_BYTES_PER_ITEM
    try:
        with zipfile.ZipFile(path) as archive:
            problems = (_pickle_problem(archive.read(entry), max_items) for entry in pickles)
            problem = next((p for p in problems if p), None)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, IndexError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path} is truncated or corrupt ({first_line(e)}); re-copy or re-create it") from None
    if problem:
        raise CheckpointError(f"refused to load {path}: its pickle {problem}")


class _Item:
    """What the pickle walk knows of a stack item other than text, an int or a tuple: its type, a global's dotted
    name (for what a call returns, the function's), whether it is a mapping (its keys were checked as it was
    filled), its entries so far, and for a list the type of its first element that is not a safe key, or not a
    pair with a safe key."""

    __slots__ = ("type", "name", "mapping", "size", "bad_key", "bad_pair")

    def __init__(self, type_: str, name: str = "", mapping: bool = False) -> None:
        self.type, self.name, self.mapping = type_, name, mapping
        self.size, self.bad_key, self.bad_pair = 0, None, None


_HASHING_CALLS = {"builtins.set": "set element", "builtins.frozenset": "set element",
                  "collections.Counter": "dictionary key", "collections.OrderedDict": "dictionary key"}
_LINEAR_CODECS = {"latin1", "latin-1", "latin_1", "iso-8859-1", "ascii", "utf-8", "utf8", "utf_8"}
_REBUILD_FROM_TYPE = "torch._tensor._rebuild_from_type_v2"  # calls its first argument with its third
_WHY_KEYS = ("; weights and checkpoints key their data by names (and small numbers), and other keys can be "
             "chosen to share one hash, which stalls the reader for minutes")


def _type_name(item: object) -> str:
    return item.type if isinstance(item, _Item) else type(item).__name__


def _key_type(item: object) -> str | None:
    """None for a safe dictionary key (text, or an int under ``MAX_PICKLE_KEY``); otherwise its type's name."""
    if type(item) is str or (type(item) is int and -MAX_PICKLE_KEY < item < MAX_PICKLE_KEY):
        return None
    return "int of 2**31 or more in size" if type(item) is int else _type_name(item)


def _pair_type(item: object) -> str | None:
    """None for a (safe key, value) pair, as a dict's update takes them; otherwise the offending type."""
    return _key_type(item[0]) if type(item) is tuple and len(item) == 2 else _type_name(item)


def _first(check, items) -> str | None:
    return next((problem for problem in map(check, items) if problem), None)


def _elements_problem(items: object, pairs: bool) -> str | None:
    """The type of the first element that a set, Counter or dict built from ``items`` would hash unsafely, or
    None."""
    if type(items) is str or (isinstance(items, _Item) and items.mapping):
        return None  # characters, or keys that were checked as the mapping was filled
    if type(items) is tuple:
        return _first(_pair_type if pairs else _key_type, items)
    if isinstance(items, _Item) and items.type == "list":
        return items.bad_pair if pairs else items.bad_key
    return _type_name(items)


def _size(items: object) -> int:
    return items.size if isinstance(items, _Item) else len(items) if type(items) in (tuple, str) else 0


def _call_problem(function: object, args: object) -> tuple[str | None, int]:
    """Why calling ``function`` (an allowed global) with ``args`` could stall the unpickler, or None; and the
    entries the call fills."""
    while True:
        if type(args) is not tuple:
            return "calls a function with arguments that are not a tuple, which pickle never writes", 0
        name = function.name if isinstance(function, _Item) and function.type == "global" else ""
        if name != _REBUILD_FROM_TYPE or len(args) < 3:
            break
        function, args = args[0], args[2]
    if name in _HASHING_CALLS and args:
        problem = _elements_problem(args[0], pairs=name == "collections.OrderedDict") if len(args) == 1 else "tuple"
        return problem and f"has a {_HASHING_CALLS[name]} of type {problem}{_WHY_KEYS}", _size(args[0])
    if name == "builtins.bytearray" and args and type(args[0]) is int:
        return f"asks for a bytearray of {args[0]:,} bytes; torch.save stores bytes as text", 0
    if name in ("_codecs.encode", "builtins.bytearray") and len(args) > 1 and not (
            type(args[1]) is str and args[1].lower() in _LINEAR_CODECS):  # bytearray(text, codec) encodes too
        codec = repr(args[1][:40]) if type(args[1]) is str else f"a {_type_name(args[1])}"
        return f"encodes text with the codec {codec}, which can take minutes; torch.save uses 'latin1'", 0
    return None, 0


def _state_problem(state: object) -> str | None:
    """Why BUILD with ``state`` could stall the unpickler, or None: it updates an object's ``__dict__`` from the
    state (or from each half of a (state, slots) pair), hashing its keys."""
    def settled(part: object) -> bool:
        return isinstance(part, _Item) and (part.mapping or part.type == "None")

    if settled(state) or (type(state) is tuple and len(state) == 2 and all(map(settled, state))):
        return None
    problem = _elements_problem(state, pairs=True)
    return problem and f"has a dictionary key of type {problem}{_WHY_KEYS}"


def _pop(stack: list, count: int) -> list:
    if count > len(stack):
        raise IndexError("the pickle pops more than its stack holds")
    items = stack[len(stack) - count:]
    del stack[len(stack) - count:]
    return items


def _pickle_problem(data: bytes, max_items: int) -> str | None:
    """Why unpickling ``data`` could stall the reader, or None; read before anything is unpickled.

    A dictionary or set whose keys share one hash takes quadratic time to fill: Python hashes ints, floats and
    tuples of them deterministically (``hash(k * (2**61 - 1)) == 0``), so 780 KB of such keys took torch's
    weights-only unpickler 87 s. The opcodes are walked with ``pickletools.genops`` (nothing is built or run)
    over a stack of what each item is, the way ``pickletools.dis`` tracks it, and every key that would be hashed,
    by SETITEMS or by a call to ``set``, ``Counter`` or ``OrderedDict`` or a BUILD, must be text or a small int.
    The dict entries and containers built are counted (at most ``max_items``: a flood of them costs the unpickler
    seconds and memory), and the allowed calls that do unbounded work from a few bytes are refused: ``bytearray(n)``
    and text encoded with a slow codec (punycode is quadratic). Malformed opcodes raise ValueError, IndexError or
    KeyError.
    """
    stack: list = []
    marks: list[list] = []
    memo: dict = {}
    built = 0  # dict entries and containers
    for opcode, arg, _ in pickletools.genops(data):
        group, problem = _OPCODE_GROUPS[opcode.name], None
        if group == "get":
            stack.append(memo[arg])
        elif group == "put":
            memo[arg if arg is not None else len(memo)] = stack[-1]  # MEMOIZE takes the next index
        elif group == "value":  # text and ints are kept as they are; keys and codec names are read from them
            stack.append(arg if type(arg) in (int, str) else _SHARED_ITEMS[opcode.name])
        elif group == "push":  # one item of a known type: containers are followed as they fill, the rest shared
            shared = _SHARED_ITEMS.get(opcode.name)
            if shared is None:
                built += 1
            stack.append(shared or _Item(opcode.stack_after[0].name, mapping=opcode.name == "EMPTY_DICT"))
        elif group == "mark":
            built += 1
            marks.append(stack)
            stack = []
        elif group == "setitems":
            name = opcode.name
            items, stack = (_pop(stack, 2), stack) if name == "SETITEM" else (stack, marks.pop())
            is_set = name in ("ADDITEMS", "FROZENSET")
            keys = items if is_set else items[::2]
            built += len(keys)
            problem = _first(_key_type, keys)
            if problem:
                return f"has a {'set element' if is_set else 'dictionary key'} of type {problem}{_WHY_KEYS}"
            if name in ("DICT", "FROZENSET"):
                built += 1
                stack.append(_Item(opcode.stack_after[0].name, mapping=name == "DICT"))
            if isinstance(stack[-1], _Item) and (stack[-1].mapping or stack[-1].type == "set"):
                stack[-1].size += len(keys)
        elif group == "append":
            items, stack = (_pop(stack, 1), stack) if opcode.name == "APPEND" else (stack, marks.pop())
            if opcode.name == "LIST":
                built += 1
                stack.append(_Item("list"))
            target = stack[-1]
            if isinstance(target, _Item) and target.type == "list":
                target.size += len(items)
                target.bad_key = target.bad_key or _first(_key_type, items)
                target.bad_pair = target.bad_pair or _first(_pair_type, items)
        elif group == "tuple":
            items, stack = (stack, marks.pop()) if opcode.name == "TUPLE" else (
                _pop(stack, len(opcode.stack_before)), stack)
            built += 1
            stack.append(tuple(items))
        elif group == "global":
            module, attribute = arg.split(" ", 1) if opcode.name == "GLOBAL" else map(str, _pop(stack, 2))
            if (module, attribute) in NAME_MAPPING:
                module, attribute = NAME_MAPPING[module, attribute]
            else:
                module = IMPORT_MAPPING.get(module, module)
            stack.append(_Item("global", f"{module}.{attribute}"))
        elif group == "call":
            function, args = _pop(stack, len(opcode.stack_before))[:2]
            problem, filled = _call_problem(function, args)
            built += filled + 1
            called = function.name if isinstance(function, _Item) else ""
            stack.append(_Item(called.rpartition(".")[2] or "object", called,
                               mapping=called in ("collections.OrderedDict", "collections.Counter")))
        elif group == "build":
            state = _pop(stack, 1)[0]
            problem = _state_problem(state)
            built += _size(state)
        else:  # the rest pop and push items the walk does not follow
            before = opcode.stack_before
            if group == "marked":
                stack = marks.pop()
                before = before[:before.index(pickletools.markobject)]
            popped = _pop(stack, len(before))
            stack += popped * 2 if opcode.name == "DUP" else [_SHARED_ITEMS["any"]] * len(opcode.stack_after)
        if problem:
            return problem
        if built > max_items:
            return (f"builds over {max_items:,} dictionary entries and containers, more than weights and checkpoints "
                    "of its size hold; it may be built to stall the reader")
    return None


def _opcode_group(opcode: pickletools.OpcodeInfo) -> str:
    for group, names in (("get", "GET BINGET LONG_BINGET"), ("put", "PUT BINPUT LONG_BINPUT MEMOIZE"),
                         ("mark", "MARK"), ("setitems", "SETITEM SETITEMS DICT ADDITEMS FROZENSET"),
                         ("append", "APPEND APPENDS LIST"), ("tuple", "TUPLE TUPLE1 TUPLE2 TUPLE3 EMPTY_TUPLE"),
                         ("global", "GLOBAL STACK_GLOBAL"), ("call", "REDUCE NEWOBJ NEWOBJ_EX"), ("build", "BUILD")):
        if opcode.name in names.split():
            return group
    pushes = [a.name for a in opcode.stack_after]
    if not opcode.stack_before and pushes in (["int"], ["int_or_bool"], ["str"], ["bytes_or_str"]):
        return "value"
    if not opcode.stack_before and len(pushes) == 1:
        return "push"
    return "marked" if pickletools.markobject in opcode.stack_before else "other"


_OPCODE_GROUPS = {opcode.name: _opcode_group(opcode) for opcode in pickletools.opcodes}
# One item for every push of a type the walk does not follow (a float, None, a persistent id...): millions of
# one-byte opcodes then cost no allocation. Lists, dicts and sets get their own, as they are filled.
_SHARED_ITEMS = {opcode.name: _Item(opcode.stack_after[0].name) for opcode in pickletools.opcodes
                 if _OPCODE_GROUPS[opcode.name] in ("value", "push")
                 and opcode.stack_after[0].name not in ("list", "dict", "set")} | {"any": _Item("any")}


def safetensors_shapes(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor of a ``.safetensors`` file as a ``meta`` tensor (name, dtype, shape), from its header alone.

    The header is checked before anything else is read: at most ``MAX_SAFETENSORS_HEADER_BYTES`` and
    ``MAX_TENSORS`` entries, known dtypes, at most ``MAX_TENSOR_DIMS`` dimensions, and each tensor's bytes
    exactly where the header says, inside the file. Callers compare these names and shapes with the model
    before reading any data, so a file declaring a 3 GB tensor the model has no place for costs nothing.
    Raises CheckpointError with one line.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            prefix = f.read(8)
            length = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
            if not 2 <= length <= min(MAX_SAFETENSORS_HEADER_BYTES, size - 8):
                raise CheckpointError(
                    f"{path} is not a readable safetensors file (its header declares {length:,} bytes; a file of "
                    f"{size:,} bytes holds at most {min(MAX_SAFETENSORS_HEADER_BYTES, max(size - 8, 0)):,})")
            text = f.read(length)
    except OSError as e:
        raise CheckpointError(f"cannot read {path} ({e.strerror or type(e).__name__})") from None
    try:
        header = json.loads(text.decode("utf-8"))
    except RecursionError:
        raise CheckpointError(f"{path} is not a readable safetensors file (its header is nested too deeply)") from None
    except ValueError as e:  # also UnicodeDecodeError
        raise CheckpointError(f"{path} is not a readable safetensors file (its header is not JSON: "
                              f"{first_line(e)})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} is not a readable safetensors file (its header is not a JSON object)")
    header.pop("__metadata__", None)
    if len(header) > MAX_TENSORS:
        raise CheckpointError(f"refused to load {path}: it lists {len(header):,} tensors, more than the "
                              f"{MAX_TENSORS:,} any model this program opens has")
    data_bytes = size - 8 - length
    shapes = {}
    for name, entry in header.items():
        problem = _safetensors_entry_problem(entry, data_bytes)
        if problem:
            raise CheckpointError(f"{path} is not a readable safetensors file (tensor {name[:80]!r}: {problem})")
        shapes[name] = torch.empty(entry["shape"], dtype=SAFETENSORS_DTYPES[entry["dtype"]], device="meta")
    return shapes


def _safetensors_entry_problem(entry: object, data_bytes: int) -> str | None:
    if not isinstance(entry, dict) or entry.get("dtype") not in SAFETENSORS_DTYPES:
        return "not a tensor of a known dtype"
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or len(shape) > MAX_TENSOR_DIMS or not all(
            type(n) is int and n >= 0 for n in shape):
        return f"its shape must be at most {MAX_TENSOR_DIMS} sizes >= 0"
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(type(n) is int for n in offsets):
        return "its data offsets must be two numbers"
    begin, end = offsets
    numel = 1
    for n in shape:
        numel *= n
    if not 0 <= begin <= end <= data_bytes or end - begin != numel * SAFETENSORS_DTYPES[entry["dtype"]].itemsize:
        return f"its data ({begin:,} to {end:,}) does not match its shape {shape} or lies outside the file"
    return None



def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    line = text[0] if text else type(error).__name__
    if len(line) > 160:  # torch appends paragraphs of advice; its first sentence says what failed
        line = line.split(". ", 1)[0]
    return line if len(line) <= 160 else line[:157] + "..."
