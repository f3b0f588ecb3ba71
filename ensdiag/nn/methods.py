"""The method registry's helpers: run names, labels, members, and options checked against the
declarations. The kits themselves live in nn/kits/, one module per method, each registering
itself with `@register_method("name")` (nn/kit.py) when `ensdiag.nn` is imported.

A kit owns everything that distinguishes its method: its layers (built under the same
attribute names as the plain layers, so member i of any method loads into the `single`
network; see `EnsembleModel.member_state_dict`), how many data orders an epoch draws, how a
batch reaches the members, the loss reduction over members, which parameters take no weight
decay, how members are run, its report label, run variants and options.
"""

from ..errors import EnsdiagError
from .kit import METHODS


def members_for(method: str, k: int) -> int:
    """The number of members a run of `method` builds with `--members k` (single: always 1)."""
    return METHODS[method].fixed_members or k


def run_methods() -> dict[str, tuple[str, dict]]:
    """Run name -> (method, fixed options): every method, and the variants kits declare."""
    runs = {name: (name, {}) for name in METHODS}
    for name, kit in METHODS.items():
        runs.update({run: (name, fixed) for run, (fixed, _) in kit.run_variants.items()})
    return runs


def run_label(run: str) -> str:
    """How reports name a run: the kit's label, or its variant's; `<method>@<folder>` (a method kept
    apart by folder in a report of several run folders) as "<label> (<folder>)"."""
    base, at, folder = run.partition("@")
    if at:
        return f"{run_label(base)} ({folder})"
    for kit in METHODS.values():
        if run in kit.run_variants:
            return kit.run_variants[run][1]
    return METHODS[run].label if run in METHODS else run


def parse_method_options(pairs) -> dict[str, dict]:
    """`--option METHOD.NAME=VALUE` pairs -> {method: {name: value}}, each value parsed and checked
    against the option's declaration."""
    parsed: dict[str, dict] = {}
    for pair in pairs or ():
        target, equals, text = pair.partition("=")
        method, dot, name = target.partition(".")
        if not equals or not dot:
            raise EnsdiagError(f"--option takes METHOD.NAME=VALUE, got {pair!r}")
        if method not in METHODS:
            raise EnsdiagError(f"--option {pair!r}: unknown method {method!r}; choose from {', '.join(METHODS)}")
        declared = {option.name: option for option in METHODS[method].declared}
        if name not in declared:
            raise EnsdiagError(f"--option {pair!r}: {method} has no option {name!r} "
                               f"(it has: {', '.join(declared) or 'none'})")
        parsed.setdefault(method, {})[name] = declared[name].from_text(text, method)
    return parsed


def resolve_options(method: str, given: dict, arch_defaults: dict, convolutional: bool = True,
                    arch: str = "this architecture") -> dict:
    """The method's full option dict: given values over architecture and method defaults."""
    kit = METHODS.named(method)
    allowed = kit.options
    extra = sorted(set(given) - set(allowed))
    if extra:
        accepted = ", ".join(allowed) or "none"
        raise EnsdiagError(f"method {method!r} takes no option {', '.join(extra)} (accepted: {accepted})")
    options = {name: given.get(name, arch_defaults.get(name, default)) for name, default in allowed.items()}
    for option in kit.declared:  # each value against its one declaration
        options[option.name] = option.check(options[option.name], method)
    kit.check_options(options, convolutional, arch)
    return options
