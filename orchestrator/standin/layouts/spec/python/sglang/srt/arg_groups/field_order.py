# Stand-in server: the positional order of ServerArgs' fields.
"""``POSITIONAL_FIELD_ORDER``: the constructor order of ``ServerArgs`` (adding to it is not needed for a new flag)."""

POSITIONAL_FIELD_ORDER = (
    "model_path",
    "tokenizer_path",
    "tokenizer_mode",
    "trust_remote_code",
    "context_length",
    "revision",
    "host",
    "port",
    "speculative_algorithm",
    "speculative_accept_threshold_single",
    "speculative_accept_threshold_acc",
    "speculative_token_map",
)
