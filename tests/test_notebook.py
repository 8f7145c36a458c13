"""docs/notebook.ipynb, the notebook API's walk-through, runs clean: executed by nbclient on a
fresh kernel (this environment's Python) with Streamlit made unimportable in it, any cell's
error fails the test. The file is kept without outputs (a diff shows only code and prose)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "docs" / "notebook.ipynb"
FIGURE_CALL = re.compile(r"vx\.(similarity|bias|attention|rollout|kernels|query_kernels|attention_distance)\(")
NO_STREAMLIT = """import importlib.abc, sys
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "streamlit":
            raise ImportError(f"{name} is blocked: the notebook API must work without it")
sys.meta_path.insert(0, _Block())"""


def test_the_notebook_is_saved_without_outputs():
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)


@pytest.mark.slow
def test_the_notebook_runs_on_a_fresh_kernel_without_streamlit():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(NO_STREAMLIT))
    nb.cells.insert(len(nb.cells), nbformat.v4.new_code_cell("import sys; assert 'streamlit' not in sys.modules"))
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})   # as opened there
    client.execute()                                   # raises CellExecutionError on any cell's error
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    figure_cells = [c for c in nb.cells if c.cell_type == "code" and FIGURE_CALL.match(c.source.splitlines()[-1])]
    assert len(figure_cells) >= 9
    for c in figure_cells:                             # each figure cell showed a Plotly figure
        assert any("application/vnd.plotly.v1+json" in o.get("data", {}) for o in c.outputs), c.source
    assert any("sape2+ape_report.html" in o.get("text", "") for o in outputs)
