import pytest


def test_the_thread_tuner_drops_to_one_thread_after_a_stall_and_tries_again(monkeypatch):
    """A decode step 10x slower than usual (a descheduled OpenMP thread beside a busy process) switches PyTorch to
    one thread for a while; the full count comes back after the hold, and a stall then doubles the hold."""
    import gpt_serve.generation.backends.torch_backend as tb

    counts = []
    monkeypatch.setattr(tb.torch, "set_num_threads", counts.append)
    now = [0.0]
    tuner = tb.ThreadTuner(hold=4, clock=lambda: now[0])
    tuner.most = tuner.current = 2  # as if the process had 2 threads

    def step(seconds):
        def run():
            now[0] += seconds
            return "logits"

        return tuner.run(run)

    for _ in range(10):
        assert step(0.002) == "logits"
    assert counts == [] and tuner.current == 2
    step(0.1)  # a stall
    assert counts == [1] and tuner.stalls == 1
    for _ in range(4):
        step(0.002)
    assert counts == [1, 2]  # the hold is over: the full count again
    step(0.1)
    for _ in range(7):
        step(0.002)
    assert counts == [1, 2, 1] and tuner.current == 1  # the second hold is twice as long (8 steps)
    step(0.002)
    assert counts == [1, 2, 1, 2]
    for _ in range(20):
        step(0.015)  # slower steps below the 20 ms floor are no stall
    assert tuner.current == 2 and tuner.stalls == 2


def test_the_thread_tuner_does_nothing_with_one_thread():
    import gpt_serve.generation.backends.torch_backend as tb

    tuner = tb.ThreadTuner()
    assert tuner.most == 1  # the tests run PyTorch on one thread
    assert tuner.run(lambda: 3) == 3 and tuner.current == 1


def test_decode_linear_runs_onednn_on_many_rows_each_row_as_alone():
    """`DecodeLinear` runs oneDNN's kernel on its packed weight: `F.linear`'s numbers up to float rounding, and a row's
    result does not depend on the other rows of a batch of several."""
    import torch
    import torch.nn.functional as F

    from gpt_serve.generation.backends.torch_decode import DecodeLinear

    torch.manual_seed(0)
    for shape in ((768, 192), (192, 768)):
        linear = torch.nn.Linear(shape[1], shape[0])
        fast = DecodeLinear(linear)
        if fast.packed is None:
            pytest.skip("this PyTorch build has no oneDNN linear kernel")
        x = torch.randn(40, 1, shape[1])
        with torch.inference_mode():
            batch = fast(x)
            torch.testing.assert_close(batch, F.linear(x, linear.weight, linear.bias), rtol=1e-5, atol=1e-4)
            for rows in (slice(0, 9), slice(9, 40), slice(20, 31), slice(3, 5), slice(0, 8)):
                assert torch.equal(fast(x[rows].clone()), batch[rows])
