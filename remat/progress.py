"""Progress bars on a terminal (defined in ``remat.passes.progress``, which profiling uses)."""

from remat.passes.progress import on_terminal, progress

__all__ = ["on_terminal", "progress"]
