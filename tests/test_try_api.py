"""The demo's last step: start `python -m serve`, transcribe clips over HTTP, stop the server."""

from serve_helpers import make_tiny_bundle

from serve.try_api import main


def test_try_api_transcribes_clips_through_a_real_server(tmp_path, speech_corpus, sentences_file, capsys):
    bundle = make_tiny_bundle(tmp_path, sentences_file)
    assert main([f"model={bundle}", f"manifest={speech_corpus['test']}", "clips=2"]) == 0
    out = capsys.readouterr().out
    assert out.count("REF: ") == 2 and out.count("HYP: ") == 2
    assert "API stopped." in out


def test_try_api_rejects_unknown_arguments(capsys):
    assert main(["modle=x.pt"]) == 2
