"""`python -m demo` refuses bad flags before it loads anything."""

import pytest

from demo.cli import build_parser


@pytest.mark.parametrize(
    "args, message",
    [
        (["--threads", "0"], "--threads: must be an integer in [1, "),
        (["--concurrency", "-2"], "--concurrency: must be an integer >= 1, got -2"),
        (["--port", "70000"], "--port: must be a TCP port in [1, 65535], got 70000"),
        (["--port", "-1"], "--port: must be a TCP port in [1, 65535], got -1"),
        (["--max-body-bytes", "0"], "--max-body-bytes: must be an integer >= 1, got 0"),
        (["--shutdown-timeout", "0"], "--shutdown-timeout: must be a number > 0, got 0"),
        (["--backend", "tensorflow"], "--backend: invalid choice: 'tensorflow'"),
        (["--stream-interval", "-1"], "--stream-interval: must be a finite number >= 0, got -1"),
        (["--stream-interval", "nan"], "--stream-interval: must be a finite number >= 0, got nan"),
        (["--max-updates-per-second", "inf"], "--max-updates-per-second: must be a finite number >= 0, got inf"),
        (["--max-updates-per-second", "lots"], "--max-updates-per-second: invalid non_negative_float value"),
    ],
)
def test_bad_flags_are_usage_errors(capsys, args, message):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(args)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_a_busy_port_is_named_before_any_model_loads(capsys):
    import time

    from demo.cli import main
    from tests.conftest import busy_port

    with busy_port() as port:
        start = time.perf_counter()
        assert main(["--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"cannot serve on 127.0.0.1:{port}" in err and f'make demo DEMO_ARGS="--port {port + 1}"' in err
    assert time.perf_counter() - start < 5  # nothing was loaded
