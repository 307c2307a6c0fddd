"""kvcxl.common — the bottom layer every part may import: command-line option types, the
size and budget grammar, the user-facing errors, progress bars, JSON output and figure
set-up.

It imports no other part of ``kvcxl`` (``tests/test_architecture.py`` checks it), and only
the standard library at module level: tqdm and matplotlib are imported inside the function
that draws, so ``kvcxl --help`` stays fast.
"""
