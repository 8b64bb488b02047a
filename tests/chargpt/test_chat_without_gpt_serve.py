"""A user with transformers and no gpt-serve chats with a `gpt-serve copy` folder: `apply_chat_template` renders
our server's prompt, and `pipeline("text-generation")` with messages (greedy, `stop_sequence="\\n\\n"`) gives our
server's reply (with the end-of-speech blank line it stopped at: transformers keeps a stop string)."""

from gpt_serve.folders.publishing import write_self_contained
from tests.chat_elsewhere import SCRIPT, our_chat, result, script_args, with_stop
from tests.conftest import run_without_gpt_serve


def test_transformers_chats_with_a_copy_as_our_server_does(tmp_path):
    folder = write_self_contained("shakespeare", tmp_path / "shakespeare-hf")
    prompt, reply, finish_reason = our_chat(folder)
    done = run_without_gpt_serve(SCRIPT, tmp_path, args=script_args(folder)[2:])
    assert done.returncode == 0, done.stderr[-3000:]
    got = result(done.stdout)
    assert got["prompt"] == prompt
    assert got["reply"]["role"] == "assistant" and got["reply"]["content"] == with_stop(reply, finish_reason)
