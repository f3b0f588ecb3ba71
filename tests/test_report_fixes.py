"""Report details: HTML tables that fit the page (measured in headless Chromium), reliability
diagrams with their bin counts, no best/worst-member marks for one-member methods, default CKA
layers without parameter-free modules, and a permutation rule declared on one's own module."""

import json
import re
import shutil
import subprocess

import pytest
import torch
from torch import nn

import ensdiag
from ensdiag.io import atomic_write_json
from ensdiag.report import make_report
from ensdiag.report.figures import reliability_figure
from ensdiag.report.render import to_html
from tests.test_report import SEEDS, run_dir, wide_report  # noqa: F401  (run_dir: the fixture)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

MEASURE = """<pre id="out"></pre><script>
const found = [...document.querySelectorAll("table")].map(t => ({
  title: t.parentElement.previousElementSibling ? t.parentElement.previousElementSibling.textContent : "",
  table: Math.ceil(t.getBoundingClientRect().width), room: Math.floor(t.parentElement.clientWidth),
  cells: [...t.querySelectorAll("td")].every(c => c.scrollWidth <= c.clientWidth + 1)}));
document.getElementById("out").textContent = JSON.stringify(found);
</script></body>"""


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed")
def test_html_tables_fit_the_page_and_no_cell_is_cut(run_dir, tmp_path):  # noqa: F811
    report = make_report(run_dir, write=False)
    wide = wide_report()["tables"][0]
    diversity = {"id": "diversity", "title": "Member diversity (mean off-diagonal)", "note": "", "rows": wide["rows"],
                 "columns": [{"name": name, "direction": None} for name in (
                     "disagreement (id)", "disagreement (shift)", "disagreement (ood)", "weight cosine",
                     "weight cosine at init", "weight cosine (aligned)", "aligned cosine, null", "CKA (id)", "CKA (ood)",
                     "train-loss barrier")]}
    for row in diversity["rows"]:
        row["cells"] = row["cells"] * 1  # ten cells, as many as the columns
    report["tables"] += [wide, diversity]
    page = tmp_path / "report.html"
    page.write_text(to_html(report, run_dir).replace("</body>", MEASURE), encoding="utf-8")
    result = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--disable-background-networking", "--disable-component-update", "--disable-sync",
                             f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,1600", "--dump-dom",
                             page.as_uri()], capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="out">(.*?)</pre>', result.stdout, re.S)
    assert found, result.stderr[-2000:]
    tables = json.loads(found.group(1))
    assert len(tables) == len(report["tables"])
    for table in tables:
        assert table["table"] <= table["room"] and table["cells"], table


def test_reliability_diagrams_show_how_many_examples_each_bin_holds():
    bins = {"lower": [i / 5 for i in range(5)], "upper": [(i + 1) / 5 for i in range(5)], "count": [0, 3, 0, 30, 300],
            "accuracy": [0, 0.3, 0, 0.7, 0.95], "confidence": [0, 0.3, 0, 0.7, 0.9]}
    figure = reliability_figure([("Single", bins), ("Deep Ensemble", bins)])
    counts = [ax for ax in figure.axes if ax.get_ylabel() == "examples" or ax.get_yscale() == "log"]
    assert len(counts) == 2
    for ax in counts:
        assert sorted(round(patch.get_height()) for patch in ax.patches) == [3, 30, 300]


def test_one_member_methods_are_not_ranked_among_members(run_dir):  # noqa: F811
    for method, accuracy in (("single", [0.99]), ("deep-ensemble", [0.5, 0.6, 0.7])):
        for seed in SEEDS:  # the single model's one member better than any Deep Ensemble member
            path = run_dir / method / f"seed-{seed}" / "metrics.json"
            metrics = json.loads(path.read_text())
            metrics["analyzers"]["calibration"]["splits"]["id"]["member_accuracy"]["value"] = accuracy
            atomic_write_json(path, metrics)
    table = next(t for t in make_report(run_dir, write=False)["tables"] if t["id"] == "members")
    names = [column["name"] for column in table["columns"]]
    single = next(row for row in table["rows"] if row["method"] == "single")
    assert single["cells"][names.index("worst member Acc")]["mean"] == pytest.approx(0.99)
    assert all("mark" not in single["cells"][names.index(name)] for name in names if name != "ensemble Acc")
    assert "Methods of one member are not ranked" in table["note"]


def test_default_cka_layers_skip_parameter_free_modules():
    from ensdiag.ensembles.modules import default_layers
    torch.manual_seed(0)
    members = [nn.Sequential(nn.Flatten(), nn.Linear(6, 8), nn.ReLU(), nn.Dropout(0.1), nn.Identity(),
                             nn.Sequential(nn.Linear(8, 8), nn.ReLU()), nn.Linear(8, 3)) for _ in range(2)]
    assert default_layers(members[0]) == ["1", "5", "6"]
    x, y = torch.randn(40, 6), torch.randint(0, 3, (40,))
    cka = ensdiag.diagnose(members, test=(x, y)).metrics["analyzers"]["cka"]["splits"]["id"]["layers"]
    assert list(cka) == ["1", "5", "6"]


class PermutableMLP(nn.Module):
    """docs/own-models.md's example of a permutation rule declared on one's own module."""

    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(6, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(torch.relu(self.hidden(x)))

    def permutation_groups(self):
        return {"hidden units": [("hidden", "out"), ("head", "in")]}


def test_a_declared_permutation_rule_aligns_ones_own_members():
    torch.manual_seed(0)
    members = [PermutableMLP() for _ in range(3)]
    shuffled = PermutableMLP()  # member 0 with its hidden units in another order: the same function
    order = torch.randperm(16)
    with torch.no_grad():
        shuffled.hidden.weight.copy_(members[0].hidden.weight[order])
        shuffled.hidden.bias.copy_(members[0].hidden.bias[order])
        shuffled.head.weight.copy_(members[0].head.weight[:, order])
        shuffled.head.bias.copy_(members[0].head.bias)
    x, y = torch.randn(50, 6), torch.randint(0, 3, (50,))
    found = ensdiag.diagnose([members[0], shuffled, members[1]], test=(x, y), train=(x, y)).metrics["analyzers"]["alignment"]
    assert found["status"] == "ok" and found["groups"] == 1
    assert found["aligned"]["matrix"]["value"][0][1] == pytest.approx(1.0)  # the permutation is undone exactly
    assert found["raw"]["matrix"]["value"][0][1] < 0.9
    assert found["max_output_change"]["value"] < 1e-5 and found["null"]["aligned"]["value"] is not None
