"""ReadBudget, the one rule every read path keeps to."""

from rocket import limits
from rocket.model import ReadBudget, read_charge


def test_batches_are_taken_while_they_fit_and_the_first_whatever_its_size():
    """A read takes a first batch bigger than its budget, then only batches whose charge still fits."""
    budget = ReadBudget(100)
    assert budget.first and budget.take(1000)  # bigger than the budget, but the first
    assert budget.spent and not budget.take(1)
    budget = ReadBudget(2 * read_charge(10))
    assert budget.take(10) and budget.take(10) and not budget.take(0)
    assert budget.bytes_left == 0 and budget.taken == 2


def test_without_at_least_one_nothing_bigger_than_the_budget_is_taken():
    """A read that need not take one batch (a later queue of the same response) keeps to the budget from the start."""
    budget = ReadBudget(limits.read_batch_overhead_bytes + 5, at_least_one=False)
    assert not budget.first and not budget.take(6) and budget.taken == 0
    assert budget.take(5) and budget.spent
