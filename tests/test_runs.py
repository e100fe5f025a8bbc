"""maskc.runs: the memory budget on descriptors (RunBudget)."""
import pytest

from maskc.errors import BindError
from maskc.runs import RunBudget


def test_run_budget_writes_its_message_only_for_the_error():
    """Binds within the cap never format the sizes' text (it is work on every bind); one past it names them."""
    def never() -> str:
        raise AssertionError("the message was made within the budget")

    budget = RunBudget(100, never, 40)
    budget.add_bytes(60)                                  # at the cap: still within
    with pytest.raises(BindError, match=r"^.*the descriptor of seq_len = 8 at 1 x 1 tiles takes more than "
                                        r"max_bytes = 100 bytes"):
        RunBudget(100, lambda: "seq_len = 8 at 1 x 1 tiles", 64).add(list(range(4)))   # 64 + 4 * 12 bytes
    with pytest.raises(BindError, match="descriptor of plain text takes more"):
        RunBudget(10, "plain text", 11)
