"""`single`: one plain network, k = 1 (`MemberKit` at the architecture's own widths)."""

from ..kit import MemberKit, register_method


@register_method("single")
class SingleKit(MemberKit):
    order = 0

    def __init__(self, num_members, **options):
        super().__init__()
