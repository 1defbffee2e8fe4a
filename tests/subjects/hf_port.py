"""A user's transformers BERT, built the way a user builds one from bert_multi's config: the original
BERT's architecture, nothing of bert_multi's inside."""

import transformers


def _hf_config(config, pad_token_id=None):
    hf = transformers.BertConfig(
        vocab_size=config.vocab_size, hidden_size=config.num_hiddens, intermediate_size=config.ffn_num_hiddens,
        num_attention_heads=config.num_heads, num_hidden_layers=config.num_blks,
        max_position_embeddings=config.max_len, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        layer_norm_eps=config.semantics.layer_norm_eps, hidden_act="gelu", pad_token_id=pad_token_id,
    )  # fmt: skip
    hf._attn_implementation = "eager"
    return hf


def build(config, pad_token_id=None):
    return transformers.BertForPreTraining(_hf_config(config, pad_token_id))


def build_class(config, name):
    """One of transformers' other BERT classes: ``BertForMaskedLM``, ``BertForSequenceClassification``, ..."""
    return getattr(transformers, name)(_hf_config(config))


def build_encoder_only(config):
    return build(config).bert
