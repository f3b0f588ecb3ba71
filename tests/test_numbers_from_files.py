"""Numbers read from files and typed as options are ASCII decimal digits, their length checked before
int() or float(): another script's digits ("٣", "５"), superscripts ("²") and a 5,000-digit number
are refused with one line naming the file and line (exit 2), or kept as text where text is
allowed, never read as a number and never an internal error."""

import json
import re

import pytest

from .cli import assert_one_line_error, run_cli
from .test_lm_eval import copied, edit

OTHER_DIGITS = ["²", "٣", "５", "０", "¹", "۲", "߃", "1" * 5000, "0" * 4400 + "1"]


@pytest.mark.parametrize("target", OTHER_DIGITS)
def test_a_target_in_other_digits_or_too_long_is_no_index(target, tmp_path, capsys):
    paths = copied(tmp_path)
    edit(paths[1], 0, lambda text: re.sub(r'"target": "\d"', f'"target": "{target}"', text))
    line = assert_one_line_error(capsys, "analyze", *paths, match=re.escape(str(paths[1])) + ", line 1: target .* is "
                                 "(neither a choice index 0..3 nor a choice's text|digits lm-eval cannot have logged|"
                                 "choice index .*, but the question has 4 choices)")
    assert "internal error" not in line and len(line) < 400


def test_a_choice_whose_text_is_another_scripts_digit_is_read_as_that_text(tmp_path, capsys):
    """Without the task's config (samples files alone) the target "٣" is no index (not ASCII) and
    names choice 2 by its text; with ensq's template config lm-eval itself could not have logged it
    (it reads a template's digits with ast.literal_eval)."""
    from .test_lm_eval import numeric_choices
    paths = copied(tmp_path)
    for path in paths:  # choice 2's text is "٣"; the target "٣" names it (as text), not choice 3
        edit(path, 0, lambda text: numeric_choices(json.loads(text), ["a", "b", "٣", "d"], "٣", [-3, -2, -1, -4], 1.0))
    assert_one_line_error(capsys, "analyze", *paths, match="target '٣' is digits lm-eval cannot have logged")
    for results in (path.parent.glob("results_*.json") for path in paths):
        next(results).unlink()
    code, out, err = run_cli(capsys, "analyze", *paths, "--format", "json")
    assert code == 0, err
    assert json.loads(out)["analyzers"]["calibration"]["splits"]["id"]["accuracy"]["value"] > 0


@pytest.mark.parametrize("value", ["٣", "-٣.5", "５", "-1.5٣", "²", "1" * 5000, "-" + "9" * 70])
def test_a_log_likelihood_in_other_digits_or_too_long_is_not_a_number(value, tmp_path, capsys):
    paths = copied(tmp_path)
    edit(paths[0], 2, lambda text: re.sub(r'"filtered_resps": \[\["[^"]*"', f'"filtered_resps": [["{value}"', text))
    assert_one_line_error(capsys, "analyze", *paths, match=re.escape(str(paths[0])) + ", line 3: choice 0's "
                          "log-likelihood .* is not a number")


@pytest.mark.parametrize("value", ["٣m", "１h", "1h30m5", "5m5m", "1s1m", "30m1h", "5m ٣s", "1" * 5000, "²"])
def test_a_budget_in_other_digits_or_with_units_repeated_or_missing_is_refused(value, capsys):
    import ensdiag
    from ensdiag.errors import EnsdiagError
    from ensdiag.numbers import parse_seconds
    assert_one_line_error(capsys, "evaluate", __file__, "--budget", value, match="budget .* is not a duration")
    with pytest.raises(EnsdiagError, match="is not a duration"):
        parse_seconds(value)
    with pytest.raises(EnsdiagError, match="precision target"):
        ensdiag.diagnose([], test=([], []), measure=ensdiag.Measure(precision=value))


@pytest.mark.parametrize("value", [10**400, -10**400, float("inf"), float("nan"), 0, -1])
def test_a_budget_or_precision_beyond_any_float_is_refused(value):
    from ensdiag.errors import EnsdiagError
    from ensdiag.numbers import parse_precision, parse_seconds
    with pytest.raises(EnsdiagError, match="budget .*: a finite duration above 0 seconds"):
        parse_seconds(value)
    with pytest.raises(EnsdiagError, match="precision target .*: a finite interval half-width above 0"):
        parse_precision(value)


def test_names_from_files_with_other_digits_are_text():
    from ensdiag.foreign.lm_eval_files import run_name
    from ensdiag.lora.adapters import natural_order
    from ensdiag.lora.analysis import layer_depth
    assert layer_depth("model.layers.12.mlp") == 12
    for name in ("model.layers.٣.mlp", "model.layers.².mlp", f"model.layers.{'1' * 5000}.mlp"):
        assert layer_depth(name) is None
    assert sorted(["l.10", "l.2", "l.²", "l.٣", f"l.{'9' * 5000}"], key=natural_order)[:2] == ["l.2", "l.10"]
    members = [{"peft": f"runs/lora-seed٣/adapter-{i}"} for i in range(2)]
    assert run_name({"members": members}) is None  # "seed٣" names no seed: the run needs --method
    assert run_name({"members": [{"peft": f"runs/lora-seed3/adapter-{i}"} for i in range(2)]}) == ("lora", 3)
