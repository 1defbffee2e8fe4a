import pytest

from bert_multi import CONFIGS, BERTConfig


def test_round_trip_through_dict():
    config = BERTConfig(vocab_size=7, num_hiddens=6, ffn_num_hiddens=5, num_heads=3, num_blks=1, dropout=0.1, max_len=9)
    assert BERTConfig.from_dict(config.to_dict()) == config
    assert config.head_dim == 2


def test_chapter_config_is_the_books():
    assert CONFIGS["chapter"] == BERTConfig(10000, 768, 1024, 4, 2, dropout=0.0, max_len=1000)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"vocab_size": 0}, "vocab_size must be a positive int"),
        ({"num_blks": -1}, "num_blks must be a positive int"),
        ({"num_hiddens": 10, "num_heads": 4}, "divisible by num_heads"),
        ({"max_len": 2.0}, "max_len must be an int"),
        ({"num_heads": True}, "num_heads must be an int"),
        ({"dropout": 1.0}, r"dropout must be in \[0, 1\)"),
        ({"dropout": -0.1}, r"dropout must be in \[0, 1\)"),
        ({"dropout": "0.1"}, "dropout must be a number"),
    ],
)
def test_invalid_configs_are_rejected_with_a_reason(changes, message):
    fields = dict(vocab_size=10, num_hiddens=8, ffn_num_hiddens=16, num_heads=2, num_blks=1)
    with pytest.raises(ValueError, match=message):
        BERTConfig(**{**fields, **changes})


def test_from_dict_names_unknown_and_missing_fields():
    with pytest.raises(ValueError, match="unknown BERTConfig field"):
        BERTConfig.from_dict({**CONFIGS["tiny"].to_dict(), "num_layers": 2})
    with pytest.raises(ValueError, match=r"missing field\(s\) \['num_blks'\]"):
        BERTConfig.from_dict({k: v for k, v in CONFIGS["tiny"].to_dict().items() if k != "num_blks"})


def test_config_is_frozen():
    with pytest.raises(AttributeError):
        CONFIGS["tiny"].num_blks = 3


def test_d2l_args_are_bert_models_positional_arguments_in_order():
    config = BERTConfig(vocab_size=7, num_hiddens=6, ffn_num_hiddens=5, num_heads=3, num_blks=1, dropout=0.1, max_len=9)
    assert config.d2l_args() == (7, 6, 5, 3, 1, 0.1, 9)
