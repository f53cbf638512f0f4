"""A mapping file's rules are user input (issue 52, item 4): a rule that backtracks without end is stopped by a
time limit with one line naming it, and Ctrl-C reaches a match in progress."""

import signal

import pytest
import torch

from vit.model import ViTConfig
from vit.sources.ports.libraries import mapping

# Each of the 2**40 ways to split 40 a's between the two branches is tried before the 'b' fails the match.
BACKTRACKING_RULE = "^(a|a)*$"
KEY = "a" * 40 + "b"


def rules_for(key: str, rule: str) -> tuple[dict, dict]:
    config = ViTConfig(image_size=8, patch_size=4, hidden_size=8, num_layers=1, num_heads=2, mlp_size=16,
                       num_classes=2).to_dict()
    return {key: torch.zeros(1)}, {"config": config, "keys": {rule: None}}


def test_a_rule_that_backtracks_without_end_is_named_once_the_time_is_up(monkeypatch):
    monkeypatch.setattr(mapping, "MATCH_SECONDS", 0.5)
    state, rules = rules_for(KEY, BACKTRACKING_RULE)
    with pytest.raises(ValueError, match=r"^rule '\^\(a\|a\)\*\$' was still matching a{40}b when the mapping's "
                                         r"0\.5 s ran out .* simplify the rule$"):
        mapping.apply_mapping(state, rules)


def test_the_issues_rule_on_a_41_character_key_ends_at_once():
    state, rules = rules_for(KEY, "^(a+)+$")
    with pytest.raises(ValueError, match="is matched by no rule"):
        mapping.apply_mapping(state, rules)


def test_ctrl_c_reaches_a_rule_while_it_matches(monkeypatch):
    monkeypatch.setattr(mapping, "MATCH_SECONDS", 600.0)
    state, rules = rules_for(KEY, BACKTRACKING_RULE)
    previous = signal.signal(signal.SIGALRM, signal.default_int_handler)  # SIGALRM stands in for Ctrl-C's SIGINT
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        with pytest.raises(KeyboardInterrupt):
            mapping.apply_mapping(state, rules)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
