"""What autofit records and prints of a script's arguments (autofit.redaction): secret-looking options
keep their names, their values become ***, in both spellings; everything else as given."""

from __future__ import annotations

from autofit.redaction import is_secret_name, redacted_args


def test_secret_values_are_hidden_in_both_spellings_and_the_rest_kept():
    given = ["config/train.py", "--batch_size=12", "--wandb-api-key", "abc123", "--hf_token=hf_XYZ",
             "--password", "pw", "--token", "--eval_only=False", "--max_tokens=4096"]
    assert redacted_args(given) == ["config/train.py", "--batch_size=12", "--wandb-api-key", "***", "--hf_token=***",
                                    "--password", "***", "--token", "--eval_only=False", "--max_tokens=4096"]


def test_one_rule_for_names_from_urls_and_from_options():
    assert all(is_secret_name(n) for n in ("password", "sslpassword", "HF_TOKEN", "wandb-api-key", "aws_access_key_id",
                                           "client_secret", "key", "PGPASSWORD"))
    assert not any(is_secret_name(n) for n in ("batch_size", "keep_prob", "monkey", "max_tokens", "tokenizer_path",
                                               "dataset"))
