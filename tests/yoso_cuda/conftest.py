import pytest
import torch


@pytest.fixture
def assert_thread_count_changes_no_bit():
    """``check(compute)``: ``compute()`` (a tensor or a sequence of them) gives the same bits on one thread and on
    three. Every CPU kernel gives each row to one thread and computes it in a fixed order, so the split of the rows
    between threads (three do not divide them evenly) must change nothing. The thread count is restored after."""
    threads = torch.get_num_threads()

    def check(compute):
        results = []
        for count in (1, 3):
            torch.set_num_threads(count)
            result = compute()
            results.append([result] if isinstance(result, torch.Tensor) else list(result))
        for one, three in zip(*results, strict=True):
            assert torch.equal(one, three)

    yield check
    torch.set_num_threads(threads)
