"""`python -m demo` refuses bad flags before it loads anything."""

import pytest

from demo.cli import build_parser


@pytest.mark.parametrize(
    "args, message",
    [
        (["--threads", "0"], "--threads: must be an integer >= 1, got 0"),
        (["--concurrency", "-2"], "--concurrency: must be an integer >= 1, got -2"),
        (["--port", "70000"], "--port: must be a TCP port in [1, 65535], got 70000"),
        (["--backend", "tensorflow"], "--backend: invalid choice: 'tensorflow'"),
    ],
)
def test_bad_flags_are_usage_errors(capsys, args, message):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(args)
    assert exc.value.code == 2 and message in capsys.readouterr().err
