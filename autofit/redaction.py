"""What autofit never prints or writes: the secrets a storage URL carries (`_storage.redacted`) and the
values of a script's secret-looking arguments (`redacted_args`), both told by one rule on names.
Imported by the normal run too, so it stays light (no optuna, no torch)."""

from __future__ import annotations

#: Names whose values are secrets (libpq's password and sslpassword, MySQL drivers' passwd and pwd,
#: tokens and keys of cloud drivers and trackers), or that hold one of these as a word: `hf_token`,
#: `wandb-api-key`, `aws_access_key_id` are secret; `max_tokens`, `tokenizer_path`, `keep_prob` are not.
_SECRET_WORDS = frozenset({"pwd", "token", "key", "apikey", "auth"})
_SECRET_PARTS = ("password", "passwd", "secret")  # never innocent, wherever they stand in a name
MASK = "***"


def is_secret_name(name: str) -> bool:
    """Whether a parameter or option of this name holds a secret (one of its words, split on _ - ., is)."""
    name = name.strip().lower()
    words = name.replace("-", "_").replace(".", "_").split("_")
    return any(part in name for part in _SECRET_PARTS) or any(word in _SECRET_WORDS for word in words)


def redacted_args(args: list[str] | tuple[str, ...]) -> list[str]:
    """A script's arguments as they may be recorded (the study, the best-config file) or printed: the
    value of each secret-looking option becomes `***`, written `--name=value` or `--name value`."""
    out: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next and not arg.startswith("-"):
            out.append(MASK)
            hide_next = False
            continue
        hide_next = False
        name, equals, _ = arg.lstrip("-").partition("=")
        if arg.startswith("-") and is_secret_name(name):
            if equals:
                out.append(arg[:arg.index("=") + 1] + MASK)
                continue
            hide_next = True
        out.append(arg)
    return out
