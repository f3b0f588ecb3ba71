"""The notebook summary (`Diagnosis._repr_html_`): one element with inline styles only, holding the
summary line, the main numbers and the heatmaps; rendered in headless Chromium inside a page with
its own styles, whose elements' computed styles must be the same with and without it."""

import base64
import html
import json
import re
import shutil
import subprocess

import pytest
import torch
from torch import nn

import ensdiag

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _diagnosis(k=3):
    torch.manual_seed(0)
    members = [nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)) for _ in range(k)]
    x, y = torch.randn(80, 6), torch.randint(0, 3, (80,))
    return ensdiag.diagnose(members, test=(x, y), ood=torch.randn(30, 6) * 3, measure=ensdiag.Measure(geometry=False))


def test_the_summary_is_one_self_styled_element_with_numbers_and_heatmaps():
    diagnosis = _diagnosis()
    text = diagnosis._repr_html_()
    assert text.startswith("<div style=") and text.endswith("</div>")
    for tag in ("<style", "<html", "<body", "<script", "<link", "class=", " id="):
        assert tag not in text.lower()
    assert all("style=" in tag for tag in re.findall(r"<(?:div|table|th|td|img)\b[^>]*>", text))
    flat = diagnosis.flat()
    assert f">{flat['calibration/id/accuracy']:.3f}<" in text and f">{flat['disagreement/ood/mean']:.3f}<" in text
    assert "members disagree on" in html.unescape(text)
    png = base64.b64decode(re.search(r'src="data:image/png;base64,([^"]+)"', text).group(1))
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Not measured:" in text and "custom preset" not in text  # no report boilerplate
    single = _diagnosis(1)._repr_html_()
    assert "data:image/png" not in single and "1 member: a single model" in single


HOSTILE = "<script>alert(1)</script>"


def _hostile(node, keys: bool):
    """`node` with every string and number (and with `keys`, every key) replaced by markup, as an edited metrics.json may hold."""
    if isinstance(node, dict):
        return {(HOSTILE + key if keys and isinstance(key, str) else key): _hostile(value, keys) for key, value in node.items()}
    if isinstance(node, list):
        return [_hostile(value, keys) for value in node]
    return HOSTILE if isinstance(node, (str, int, float)) and not isinstance(node, bool) else node


@pytest.mark.parametrize("keys", [False, True])
def test_every_field_of_an_edited_diagnosis_is_shown_as_text_never_as_markup(keys):
    from ensdiag.report.notebook import diagnosis_html
    text = diagnosis_html(_hostile(_diagnosis().metrics, keys))
    assert "<script" not in text.lower() and text.startswith("<div style=") and text.endswith("</div>")
    assert keys or f"k = {HOSTILE} · {HOSTILE} classes" in html.unescape(text)  # num_members, num_classes: literal


PROPERTIES = ["color", "background-color", "font-family", "font-size", "font-weight", "line-height", "margin-top",
              "margin-bottom", "padding-left", "border-bottom-width", "border-collapse", "text-align", "display",
              "white-space", "max-width", "box-sizing"]

PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><style>
body {{ font-family: Georgia, serif; color: rgb(10, 60, 10); background: rgb(240, 240, 255); margin: 17px; }}
p {{ margin: 23px 0; line-height: 1.9; }} table {{ border-collapse: separate; color: rgb(200, 0, 0); }}
td {{ padding: 9px; border-bottom: 3px solid black; text-align: center; white-space: pre; }}
img {{ display: inline; max-width: 50px; }} div {{ font-size: 15px; box-sizing: content-box; }}
</style></head><body>
<p id="before">before</p><table id="table"><tr><td id="cell">page cell</td></tr></table><img id="image" alt="x">
{fragment}
<div id="div">page div</div><p id="after">after</p>
<pre id="out"></pre>
<script>
const ids = ["before", "table", "cell", "image", "div", "after"];
const found = {{}};
for (const el of [document.documentElement, document.body, ...ids.map(id => document.getElementById(id))]) {{
  const style = getComputedStyle(el);
  found[el.id || el.tagName] = Object.fromEntries({properties}.map(p => [p, style.getPropertyValue(p)]));
}}
const ours = document.querySelector('img[alt^="member disagreement"]');
found.ours = ours ? {{loaded: ours.complete && ours.naturalWidth > 0}} : null;
document.getElementById("out").textContent = JSON.stringify(found);
</script></body></html>"""


def _computed(tmp_path, name, fragment):
    page = tmp_path / f"{name}.html"
    page.write_text(PAGE.format(fragment=fragment, properties=json.dumps(PROPERTIES)), encoding="utf-8")
    result = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--disable-background-networking", "--disable-component-update", "--disable-sync",
                             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=3000", "--dump-dom",
                             page.as_uri()], capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="out">(.*?)</pre>', result.stdout, re.S)
    assert found, result.stderr[-2000:]
    return json.loads(html.unescape(found.group(1)))


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed")
def test_the_summary_changes_no_style_of_the_page_it_is_shown_in(tmp_path):
    fragment = _diagnosis()._repr_html_()
    bare, shown = _computed(tmp_path, "bare", ""), _computed(tmp_path, "shown", fragment)
    assert bare.pop("ours") is None and shown.pop("ours") == {"loaded": True}  # the heatmaps render
    assert shown == bare
    assert shown["table"]["color"] == "rgb(200, 0, 0)" and shown["cell"]["padding-left"] == "9px"  # read, not defaults
