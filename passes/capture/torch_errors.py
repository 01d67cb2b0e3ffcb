"""Why dynamo could not capture a graph for remat, read from torch's errors.

Some capture failures are ones remat can explain and say what to do about; torch
reports them only in its messages, so they are recognised here by their text
(kept apart from the private-API adapter: this is string matching, not API).
"""

from __future__ import annotations

import re


def capture_problem(exc: BaseException) -> tuple[str, str] | None:
    """What stopped dynamo from capturing a graph for remat, when it is one of the
    cases remat explains: ``("dynamic", sizes)`` when a size marked with
    ``mark_dynamic`` was pinned, ``("no-fake", op)`` when an op has no fake
    (meta) kernel to trace its output shapes with, ``("ddp-bucket", "")`` when dynamo's
    DDP optimizer refused DDP's buckets (a ``bucket_cap_mb`` below the first bucket)."""
    from torch.fx.experimental.symbolic_shapes import ConstraintViolationError

    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, ConstraintViolationError):
            sizes = re.search(r"Constraints violated \((.*?)\)!", str(e))
            return "dynamic", sizes.group(1) if sizes else ""
        text = str(e)
        if "First bucket should be smaller/equal to other buckets" in text:
            return "ddp-bucket", ""
        if "no fake impl" in text or "no meta kernel" in text.lower():
            op = re.search(r"call_function (\S+?)\(", text) or re.search(r"<CustomOpDef\((\S+?)\)>", text)
            return "no-fake", op.group(1) if op else "an op"
        todo += [e.__cause__, e.__context__, getattr(e, "inner_exception", None)]
    return None


def without_interpreter_note(exc: BaseException) -> BaseException:
    """``exc`` without the "While executing %node ..." text torch.fx's interpreter appends to an
    error raised inside a node it runs (dynamo's DDP optimizer compiles each bucket so)."""
    text = str(exc)
    if "\n\nWhile executing " in text and len(exc.args) == 1:
        exc.args = (text.split("\n\nWhile executing ", 1)[0],)
    return exc
