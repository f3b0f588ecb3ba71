"""`single`: one plain network, k = 1 (the base kit unchanged)."""

from ..kit import Kit, register_method


@register_method("single")
class SingleKit(Kit):
    label = "Single"
    order = 0
    independent_members = True
    one_weight_set = True
    fixed_members = 1

    def check_members(self, m):
        if m != 1:
            raise ValueError("a single model takes inputs for exactly one member")
