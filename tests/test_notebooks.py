"""Every notebook in notebooks/ runs top to bottom on a fresh kernel (this interpreter),
and its outputs state the facts it is about (parsed from its final ``CHECK`` line)."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
TIMEOUT_S = int(os.environ.get("TENSOROPT_NOTEBOOK_TIMEOUT", "900"))   # per cell


def _execute(path: Path, workdir: Path) -> nbformat.NotebookNode:
    nb = nbformat.read(path, as_version=4)
    env_path = os.environ.get("PATH", "")
    # the "python3" kernel spec starts "python": make that this interpreter (the venv)
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env_path])
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    try:
        client = nbclient.NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3",
                                         resources={"metadata": {"path": str(workdir)}})
        client.execute()
    finally:
        os.environ["PATH"] = env_path
    return nb


def _text(nb) -> str:
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream":
                out.append(o.get("text", ""))
            elif "data" in o and "text/plain" in o["data"]:
                out.append(o["data"]["text/plain"])
    return "\n".join(out)


def _check_line(nb, name: str) -> dict[str, str]:
    lines = [ln for ln in _text(nb).splitlines() if ln.startswith(f"CHECK {name}")]
    assert len(lines) == 1, f"expected one 'CHECK {name}' line in the outputs, got {lines}"
    return dict(re.findall(r"(\S+)=(\S+)", lines[0]))


def _images(nb) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


def test_notebooks_exist():
    names = {p.name for p in NOTEBOOKS}
    assert {"01_quickstart.ipynb", "02_vision_tradeoffs.ipynb", "03_language_tradeoffs.ipynb",
            "04_budget_to_training.ipynb"} <= names


def test_notebooks_match_their_generator():
    gen = ROOT / "scripts" / "make_notebooks.py"
    if not gen.exists():
        pytest.skip("no generator script")
    r = subprocess.run([sys.executable, str(gen), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_notebooks_are_committed_without_outputs():
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.get("outputs") and cell.get("execution_count") is None, path.name


def test_notebooks_use_the_public_api_only():
    for path in NOTEBOOKS:
        src = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
        assert not re.search(r"\btensoropt\.(engine|search|planner|costmodel|capture)\b", src), path.name
        assert not re.search(r"\._[a-z]", src.replace("._repr", "")), f"{path.name} uses a private name"
        assert "def " not in src and "class " not in src, f"{path.name} defines logic of its own"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path):
    nb = _execute(path, tmp_path)
    assert _images(nb) >= 1, "no figure was shown"
    text = _text(nb)
    assert "Traceback" not in text
    if path.name.startswith("01_"):
        facts = _check_line(nb, "quickstart")
        assert float(facts["plan_memory_bytes"]) <= float(facts["budget_bytes"])
        assert int(facts["plans"]) >= 2
        saved = list(tmp_path.glob("*.json"))
        assert len(saved) == 1
        import tensoropt

        plan = tensoropt.Plan.load(saved[0])
        assert plan.memory_bytes == float(facts["plan_memory_bytes"])
        assert "InfeasibleBudget:" in text and "minimum achievable" in text
    elif path.name.startswith("02_"):
        facts = _check_line(nb, "vision")
        budget = float(facts.pop("budget_bytes"))
        assert set(facts) == {"resnet50", "wide_resnet50_2", "vgg16"}
        assert all(float(v) <= budget for v in facts.values())
    elif path.name.startswith("03_"):
        facts = _check_line(nb, "language")
        assert float(facts["dp_bytes"]) > float(facts["budget_bytes"]) >= float(facts["plan_bytes"])
        # section 5 runs by default: LLaMA-3-8B and GPT-3 175B need more than the device under
        # data parallelism; LLaMA's fastest plan fits, and GPT-3's fastest that fits is pipelined
        # over 1024 devices in the coarse space, tensor parallel only inside a node
        large = _check_line(nb, "large")
        device = float(large["device_bytes"])
        assert float(large["llama_dp_bytes"]) > device >= float(large["llama_plan_bytes"])
        assert float(large["gpt3_dp_bytes"]) > device >= float(large["gpt3_plan_bytes"])
        mesh = [int(n) for n in large["gpt3_mesh"].split("x")]
        assert math.prod(mesh) == 1024 and mesh[-1] <= 8
        assert int(large["gpt3_pipeline"]) == mesh[0] > 1 and int(large["gpt3_microbatches"]) > 1
        assert large["gpt3_coarse"] == "True"
    elif path.name.startswith("04_"):
        facts = _check_line(nb, "training")
        assert float(facts["plan_bytes"]) <= float(facts["budget_bytes"])
        # the plan really trained: the loss went down, and its memory was in the predicted range
        assert float(facts["loss_last"]) < float(facts["loss_first"])
        assert 0.5 * float(facts["plan_bytes"]) <= float(facts["measured_bytes"]) <= 2 * float(facts["plan_bytes"])
    else:
        assert "CHECK" in text, "a notebook should end with a CHECK line of its key facts"
