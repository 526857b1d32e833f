"""No secrets in output (issue 31, 8): what fleetpatch prints and writes on the laptop
shows every value named like a secret as ***; judging keeps the real values."""
from __future__ import annotations

import json

import pytest

from fleetpatch import redact, textsafe
from fleetpatch.errors import Status
from fleetpatch.hostcalls import HostResult
from fleetpatch.report import evidence_lines, write_report


@pytest.mark.parametrize("name", ["--api-key", "--admin-api-key", "--hf-token", "HF_TOKEN", "api_key",
                                  "OPENAI_API_KEY", "apiKey", "Authorization", "ssl_keyfile_password",
                                  "client_secret", "AWS_SECRET_ACCESS_KEY", "credentials", "--auth-token"])
def test_secret_names(name):
    assert redact.is_secret_name(name)


@pytest.mark.parametrize("name", ["--port", "max_total_tokens", "tokenizer_path", "--tokenizer-mode",
                                  "skip_tokenizer_init", "num_reserved_decode_tokens", "ssl_keyfile", "key",
                                  "sglang/srt/auth/token_utils.py", "token_utils.py"])
def test_names_that_are_not_secrets(name):
    assert not redact.is_secret_name(name)


def test_argv_hides_the_value_of_every_secret_flag_in_both_spellings():
    argv = ["python", "-m", "sglang.launch_server", "--api-key", "sk-SECRET1", "--port", "30000",
            "--admin-api-key=sk-SECRET2", "--hf-token", "hf_SECRET3", "--max-total-tokens", "4096"]
    assert redact.argv(argv) == ["python", "-m", "sglang.launch_server", "--api-key", "***", "--port", "30000",
                                 "--admin-api-key=***", "--hf-token", "***", "--max-total-tokens", "4096"]
    assert argv[4] == "sk-SECRET1"   # the caller's list is untouched


def test_nested_data_env_and_server_info():
    facts = {"launch": {"argv": ["x", "--api-key", "sk-SECRET"], "env": {"HF_TOKEN": "hf_SECRET", "SGLANG_X": "1"}},
             "server_info": {"api_key": "sk-SECRET", "admin_api_key": None, "max_total_tokens": 4096,
                             "tokenizer_path": "/m", "nested": [{"token": "t-SECRET"}]}}
    out = redact.data(facts)
    assert "SECRET" not in json.dumps(out)
    assert out["launch"]["env"] == {"HF_TOKEN": "***", "SGLANG_X": "1"}
    assert out["server_info"]["admin_api_key"] is None          # "no key" stays readable
    assert out["server_info"]["max_total_tokens"] == 4096 and out["server_info"]["tokenizer_path"] == "/m"
    assert facts["server_info"]["api_key"] == "sk-SECRET"        # the judged data keeps the real value


def test_a_host_or_patch_named_like_a_secret_is_walked_not_hidden():
    assert redact.data({"token-fix": {"status": "verified", "api_key": "sk-SECRET"}}) == \
        {"token-fix": {"status": "verified", "api_key": "***"}}


@pytest.mark.parametrize("line, shown", [
    ("server_args=ServerArgs(model_path='/m', api_key='sk-SECRET', admin_api_key=None, max_total_tokens=8)",
     "server_args=ServerArgs(model_path='/m', api_key='***', admin_api_key=None, max_total_tokens=8)"),
    ('{"api_key": "sk-SECRET", "port": 30000}', '{"api_key": "***", "port": 30000}'),
    ('{"api_key": "sk-SECRET-cut-sho', '{"api_key": "***"'),
    ("python -m sglang.launch_server --api-key sk-SECRET --port 1", "python -m sglang.launch_server --api-key *** --port 1"),
    ("x --hf-token=hf_SECRET y", "x --hf-token=*** y"),
    ("env: HF_TOKEN=hf_SECRET SGLANG_X=1", "env: HF_TOKEN=*** SGLANG_X=1"),
    ("Authorization: Bearer sk-SECRET", "Authorization: ***"),
    ("max_total_tokens=4096 tokenizer_path=/m", "max_total_tokens=4096 tokenizer_path=/m"),
    ("    sglang/srt/auth/token_utils.py: never imported", "    sglang/srt/auth/token_utils.py: never imported"),
])
def test_text_hides_secret_values_in_log_lines_and_command_lines(line, shown):
    assert redact.text(line) == shown


def test_the_terminal_path_masks_what_it_prints():
    assert "SECRET" not in textsafe.safe("launch: x --api-key sk-SECRET")
    assert "SECRET" not in textsafe.safe_line("api_key='sk-SECRET'\n")
    assert "SECRET" not in str(textsafe.cell("HF_TOKEN=hf_SECRET"))


def _result_with_secrets() -> HostResult:
    dump = "server_args=ServerArgs(model_path='/m', api_key='sk-SECRET', " + "x=1, " * 200 + ")"
    return HostResult(
        host="h1", ok=True, status=Status.VERIFIED, message="verified", patch="p@1",
        details={"evidence": [{"line_no": 3, "text": dump}],
                 "server_facts": {"launch": {"argv": ["py", "--api-key", "sk-SECRET"], "source": "process",
                                             "env": {"SGLANG_HUB_TOKEN": "t_SECRET"}},
                                  "server_info": {"port": 1, **{f"f{i}": i for i in range(60)},
                                                  "api_key": "sk-SECRET"}}})


def test_report_json_and_evidence_lines_carry_no_secret(tmp_path):
    r = _result_with_secrets()
    path = tmp_path / "report.json"
    write_report(path, "deploy-patch", True, "now", {"h1": r}, {"note": "--api-key sk-SECRET"})
    text = path.read_text()
    assert "SECRET" not in text and '"api_key": "***"' in text
    shown = "\n".join(textsafe.safe(line) for line in evidence_lines(r))
    assert "SECRET" not in shown and "--api-key ***" in shown
    assert r.details["server_facts"]["launch"]["argv"][2] == "sk-SECRET"
