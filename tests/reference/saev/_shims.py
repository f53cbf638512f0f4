"""Stand-ins for what saev imports but this environment does not install (beartype, tyro, orjson) and for saev's
own ``__version__`` / ``helpers``: no type checking, ``tyro.conf.Suppress[T]`` is ``T``, the header line is json."""

import json
from types import SimpleNamespace

__version__ = "vendored"


def _identity(obj):
    return obj


def jaxtyped(typechecker=None):
    return _identity


beartype = SimpleNamespace(beartype=_identity)


class _Suppress:
    def __class_getitem__(cls, item):
        return item


tyro = SimpleNamespace(conf=SimpleNamespace(Suppress=_Suppress))
orjson = SimpleNamespace(OPT_APPEND_NEWLINE=1)


def _jdump(obj, fd, *, option=None):
    fd.write(json.dumps(obj).encode("utf-8") + (b"\n" if option else b""))


helpers = SimpleNamespace(current_git_commit=lambda: None, jdump=_jdump)
