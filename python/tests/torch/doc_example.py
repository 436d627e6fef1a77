"""Runs the first ```python block of docs/torch.md ("A first program") as it is written, on this
rank (under mpirun): the guide's first program is a test (torch.doc_example). FIRST_OUT, the
directory it saves into, is the test's build directory (every rank sees it)."""

import os
import runpy
import sys
import tempfile
from pathlib import Path

doc = Path(__file__).resolve().parents[3] / "docs" / "torch.md"
text = doc.read_text()
start = text.index("```python\n", text.index("## A first program")) + len("```python\n")
code = text[start:text.index("```", start)]
with tempfile.TemporaryDirectory() as d:
    first = Path(d) / "first.py"
    first.write_text(code)
    sys.argv = [str(first)]
    runpy.run_path(str(first), run_name="__main__")
